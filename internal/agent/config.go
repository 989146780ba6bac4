package agent

import (
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/runtime/gvisor"
)

// Config is what runs sandboxes on this host can be told: the node agent
// of `aenv node`, and the in-process node of `aenv server` (whose
// server.Config embeds it).
type Config struct {
	// Listen is the HTTP address of the process: a server's API and
	// proxy, a node agent's node API and the sandbox traffic forwarded to
	// it.
	Listen string
	// DataDir holds durable state: secrets and templates.
	DataDir string
	// RunDir holds state that dies with the host: runsc's state, network
	// namespaces.
	RunDir string
	// RunscPath is the runsc binary; empty searches PATH.
	RunscPath string
	// EnvdPath is the static envd binary; empty looks beside this binary.
	EnvdPath string
	// BaseRootFS optionally points the base template at a prebuilt tree.
	BaseRootFS string
	// BuildWithoutNetwork runs build steps (RUN, aptInstall) without
	// network (--build-network=none).
	BuildWithoutNetwork bool
	// DNSServers, when set, are the resolvers sandboxes use instead of
	// the host's (/etc/resolv.conf).
	DNSServers []netip.Addr
	// CodeInterpreterRootFS, when set, is the tree of the code-interpreter
	// template (aenv template build-code-interpreter), served as
	// code-interpreter-v1 and kept in the warm pool beside base.
	CodeInterpreterRootFS string
	// SandboxCIDR is cut into one /30 per sandbox for host-side addresses.
	SandboxCIDR string
	// NetnsPoolSize is how many network slots are kept ready.
	NetnsPoolSize int
	// StoreURL is where snapshots are kept durably beyond this host: an
	// absolute path (a shared filesystem), file:// or s3://bucket/prefix
	// (?endpoint=&region=&path_style=true). Empty keeps them in the data
	// directory only.
	StoreURL string
	// StoreAccessKey and StoreSecretKey are S3 credentials; empty uses the
	// AWS defaults (AWS_ACCESS_KEY_ID, ...).
	StoreAccessKey, StoreSecretKey string
	// FastPath says whether runsc's systrap platform spins for syscalls
	// (gvisor.FastPath; empty: auto, off on hosts of few CPUs).
	FastPath gvisor.FastPath
	// RootImages runs sandboxes whose root is an image file on this host
	// without a gofer (gvisor.Config.RootImages).
	RootImages bool
	// BaseRootImage runs base's sandboxes from an image of its tree too
	// (made beside the tree at start). Every host builds its own base, so
	// two hosts' images differ, and gVisor restores a sandbox only from
	// the image it was saved with: a snapshot of one names it, and goes
	// with it to the store (template.Catalog.PublishBaseImage), where
	// another host reads it. With several hosts and no store, a live
	// migration of one to a host with another base fails.
	BaseRootImage bool
	// WarmPoolMemory is the host memory in bytes the warm pool's
	// prestarted sandboxes may take (what they use): each template's
	// (and user snapshot's) pool is sized to its recent peak burst of
	// creates within it (node.Config.WarmPoolMemory). 0: 5% of the
	// node's memory, at most 1 GiB; negative: no pool.
	WarmPoolMemory int64
	// WarmPoolFloor is how many base (and code-interpreter) sandboxes
	// are kept prestarted whatever the demand, within WarmPoolMemory;
	// WarmPoolMax bounds each template's pool (0: only the memory does).
	WarmPoolFloor, WarmPoolMax int
	// MaxBoots bounds the sandboxes that boot at once (node.Config.MaxBoots;
	// 0: two per CPU).
	MaxBoots int
	// EndedHistoryBytes bounds the logs and metrics the node keeps of
	// sandboxes that ended (in <data-dir>/ended-history), and
	// EndedHistoryTeamBytes those of one team; EndedHistoryRetention is
	// how long they are kept. Zero: node.EndedHistory's defaults.
	EndedHistoryBytes, EndedHistoryTeamBytes int64
	EndedHistoryRetention                    time.Duration
	// Idle says when the node reports its sandboxes idle, for the
	// cluster to pause them until their next request (node.Config.Idle).
	Idle node.IdlePolicy
	// NetnsTag names this server's nftables tables and host interfaces, so
	// that several servers can share a host.
	NetnsTag string
	// EtcdEndpoints name an external etcd cluster for the live state;
	// empty runs an embedded member in <data-dir>/etcd, reached through a
	// unix socket in the run directory.
	EtcdEndpoints []string
	// EtcdCAFile, EtcdCertFile and EtcdKeyFile are TLS for EtcdEndpoints.
	EtcdCAFile, EtcdCertFile, EtcdKeyFile string
	// EtcdClientURLs make the embedded member listen on these URLs
	// instead of its unix socket (to back up or inspect it with etcdctl,
	// to let a second server share it, or nodes reach it): https ones on
	// any address, served with a certificate of the cluster's CA to
	// clients with one (client-certificate auth and RBAC); http ones on
	// loopback only, unless InsecureCluster.
	EtcdClientURLs []string
	// EtcdPeerURLs make the embedded member one of several: it listens
	// for its peers there (https with the cluster's CA, or http on
	// loopback), and so other servers may join its cluster each with a
	// member of their own (`aenv server --join` with these too): three
	// servers make a cluster that outlives any one of them without an
	// external etcd. EtcdClientURLs must then name addresses its peers
	// and the nodes reach.
	EtcdPeerURLs []string
	// EtcdName names the embedded member among its peers (default: the
	// first server's "aenv"; a joining server's hostname).
	EtcdName string
	// EtcdInitialCluster is the etcd cluster a joining server's member
	// first starts in ("name=peerURL,..."), as its join is answered.
	EtcdInitialCluster string
	// EgressAllow exempts ranges of the host's own networks, which no
	// sandbox reaches otherwise (a test network, a service on the LAN
	// that sandboxes should use).
	EgressAllow []netip.Prefix
	// PidsLimit bounds each sandbox's host tasks, and so what its users
	// may run (templates may set their own); 0 means 1024. PidsTotal bounds
	// all sandboxes' host tasks together; 0 means 3/4 of kernel.pid_max.
	PidsLimit, PidsTotal int
	// DiskMB is each sandbox's disk (its writable filesystem, sparse on
	// the host's disk), unless its template sets one; 0 means 10 GiB and
	// a negative value keeps sandbox files in memory.
	DiskMB int
	// VolumeSize is the size in bytes of a volume created without one
	// (an ext4 image, sparse, on the host's disk); 0 means 10 GiB and a
	// negative value makes such volumes plain directories, unbounded.
	VolumeSize int64
	// RootFS says how sandboxes get their template's files: "image"
	// (the default) serves templates with a block image from it, read on
	// demand from the store by the node's image server; "eager" fetches
	// such an image whole first; "dir" copies templates whole and runs
	// them from directories.
	RootFS string
	// ImageCacheSize bounds the node's image cache, in bytes; 0 means 20%
	// of the data directory's disk.
	ImageCacheSize int64
	// ImageGrace is how long an image no sandbox uses stays mounted; 0
	// means 10 minutes.
	ImageGrace time.Duration
	// AenvPath is the aenv binary that runs the image server; empty: this
	// process's, when it is aenv, else the one beside envd.
	AenvPath string
	// Capacity is what the local node admits (zero fields: the host's
	// memory and CPUs, overcommit 4, high-water 90%).
	Capacity node.Capacity
	// OnStop says what stopping the process does with running sandboxes:
	// keep them for the next start (the default), pause them (a node
	// agent has the cluster move them away), or kill them.
	OnStop membership.StopMode
	// NodeID names this host's node; empty means the hostname.
	NodeID string
	// ClusterToken is what servers and node agents authenticate each
	// other with; empty reads $AENV_CLUSTER_TOKEN or
	// <data-dir>/secrets/cluster-token (a server generates it).
	ClusterToken string
	// DataKeyFile holds the data keys that seal secrets at rest (the
	// sealing one first); empty reads $AENV_DATA_KEY or
	// <data-dir>/secrets/data-key (a server generates it; a node agent
	// that joins through a server is handed it).
	DataKeyFile string
	// Join is a server's URL a node agent asks for the cluster's etcd
	// endpoints (instead of EtcdEndpoints). An https URL is a server's
	// cluster listener: the node joins with a join token (ClusterToken
	// then holds one) and CAHash, gets a certificate, and serves mutual
	// TLS (see joinTLS); an http URL is the old join with the cluster
	// token, in the clear.
	Join string
	// BuildMemoryMB and BuildCPUs bound each build step, BuildDiskBytes
	// the disk a build's tree is written to, BuildTimeout a build's time
	// (0: 2 GiB, 2 CPUs, 20 GiB, 30 minutes; negative: no bound); its
	// steps' pids are bounded as sandboxes' (PidsLimit). MaxBuilds is how
	// many builds run at once on this host's node, the others queued (0:
	// 2).
	BuildMemoryMB, BuildCPUs int
	BuildDiskBytes           int64
	BuildTimeout             time.Duration
	MaxBuilds                int
	// MaxImageBytes bounds the images pulled, as templates or as builds'
	// FROM: their layers as stored, and what they unpack to (0: 10 GiB;
	// negative: no bound).
	MaxImageBytes int64
	// RegistryAuth is a file of registry credentials in Docker's
	// config.json format, the only ones pulls use; empty: pulls are
	// anonymous.
	RegistryAuth string
	// CAHash pins the cluster's CA for a join at an https URL
	// ("sha256:<hex>", pki.Hash).
	CAHash string
	// Advertise is the host:port servers reach a node agent at.
	Advertise string
	// InsecureCluster allows cluster traffic in plain HTTP off loopback:
	// the old join with the cluster token, a node API without TLS, etcd
	// over http, served or reached (membership.CheckPlain, state's
	// Insecure); it is logged at every start.
	InsecureCluster bool
	// Cluster, when set, is the live state whose members (nodes,
	// servers, etcd) the host keeps every sandbox off, following them
	// as they come and go. Start sets it, and so does a server for its
	// local node; without it only the host's own networks are kept off.
	Cluster ClusterState
	Logger  *slog.Logger
}

// WithDefaults fills in the zero fields of cfg (but Listen, whose default
// is the process's: DefaultListen for a node agent).
func (cfg Config) WithDefaults() Config {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DataDir == "" {
		cfg.DataDir = "/var/lib/aenv"
	}
	if cfg.RunDir == "" {
		cfg.RunDir = "/run/aenv"
	}
	if cfg.NetnsTag == "" {
		cfg.NetnsTag = "aenv"
	}
	if cfg.SandboxCIDR == "" {
		cfg.SandboxCIDR = "10.231.0.0/16"
	}
	if cfg.NodeID == "" {
		cfg.NodeID, _ = os.Hostname()
	}
	return cfg
}
