package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/build"
	"github.com/aenvhq/aenv/internal/capacity"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/runtime/gvisor"
	"github.com/aenvhq/aenv/internal/server"
)

func newServerCmd() *cobra.Command {
	var cfg server.Config
	var logLevel, onStop string
	var drain, cleanup, localNode bool
	var trustedProxies []string
	var hs hostStrings
	var buildNetwork, buildDisk, maxImageSize, clusterTokenFile, joinTokenFile string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the aenv server (API, proxy and a local node)",
		Long: `Run the aenv server: the E2B-compatible API and sandbox proxy, with an
in-process node that runs sandboxes under gVisor on this host.

On first start it generates an API key into <data-dir>/secrets/api-key
(mode 0600; AENV_API_KEY overrides) and builds the 'base' template from
Debian packages (a few minutes, once). Needs root.

The live state (sandbox records, deadlines) is kept in etcd: by default an
embedded member in <data-dir>/etcd that listens only on a unix socket in
<run-dir>; --etcd-endpoints uses an external cluster instead (the server
waits for it, retrying, if it is down at start).

With --etcd-listen https://ADDR:PORT the embedded member serves the network
over TLS with a certificate of the cluster's CA (<data-dir>/secrets/ca.crt,
made at the first start), to clients presenting one: etcd's auth is on, and
a client's user is its certificate's name. Servers are "server:etcd-client"
(etcd's root role); a node that joins over TLS is "node:<id>", allowed only
its own registration, and removed with 'aenv node rm'. Nodes joining with
the old cluster token cannot reach such an etcd. Plain http is for loopback
only, unless --insecure-cluster.

Another API server joins the cluster with the line 'aenv cluster join-command
--server' prints on a server of it:

  aenv server --join https://SERVER:8443 --token TOKEN --ca-hash sha256:...

It checks the server's certificate against --ca-hash before it sends the
token, and is handed the cluster's etcd endpoints, data key, cluster token
and CA (with its key: every server signs certificates), which it keeps in
<data-dir>/secrets; it uses the cluster's etcd (no embedded member), and a
restart needs no token.

Three servers may hold the state themselves, each running a member of one
embedded etcd cluster, which keeps serving while any two of them run. The
first listens for peers, and each other server joins with a member of its
own (it is added as a learner, and promoted once it has caught up):

  aenv server --etcd-listen https://10.0.0.1:2379 --etcd-peer-listen https://10.0.0.1:2380
  aenv server --join https://10.0.0.1:8443 --token TOKEN --ca-hash sha256:... \
    --etcd-listen https://10.0.0.2:2379 --etcd-peer-listen https://10.0.0.2:2380

'aenv cluster etcd' lists the members and the leader; 'aenv cluster etcd
remove NAME' removes a server's member gone for good (while it stays a
member, it counts against the quorum).

Stopping the server (SIGTERM, an upgrade, even kill -9) does not stop the
sandboxes: the next start takes them over, running as they were.
--drain-on-stop pauses them on SIGTERM instead (a host that is going away),
and --on-stop=kill kills them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := hostSettings(&cfg.Config, hs, logLevel); err != nil {
				return err
			}
			cfg.NoLocalNode = !localNode
			switch buildNetwork {
			case "sandbox":
			case "none":
				cfg.BuildWithoutNetwork = true
			default:
				return &usageError{cmd: cmd, err: fmt.Errorf("--build-network must be sandbox or none, got %q", buildNetwork)}
			}
			for _, f := range []struct {
				name, val string
				dst       *int64
			}{{"--build-disk", buildDisk, &cfg.BuildDiskBytes}, {"--max-image-size", maxImageSize, &cfg.MaxImageBytes}} {
				n, err := parseBytes(f.val)
				if err != nil || n == 0 {
					return &usageError{cmd: cmd, err: fmt.Errorf("%s: %q is not a size above 0 (bytes, or with K, M, G, T)", f.name, f.val)}
				}
				*f.dst = n
			}
			if cfg.APIKey == "" {
				cfg.APIKey = os.Getenv("AENV_API_KEY")
			}
			if clusterTokenFile != "" {
				var err error
				if cfg.ClusterToken, err = readSecretFile("--cluster-token-file", clusterTokenFile); err != nil {
					return err
				}
			}
			if joinTokenFile != "" {
				var err error
				if cfg.JoinToken, err = readSecretFile("--token-file", joinTokenFile); err != nil {
					return err
				}
			}
			if cfg.JoinToken != "" && cfg.Join == "" {
				return &usageError{cmd: cmd, err: errors.New("--token and --token-file are a join token, for --join")}
			}
			if drain {
				onStop = "pause"
			}
			stopTimeout := 30 * time.Second
			switch onStop {
			case "keep":
				cfg.OnStop = cluster.StopKeep
			case "pause":
				cfg.OnStop = cluster.StopPause
				// Pausing writes every sandbox's memory to disk.
				stopTimeout = 10 * time.Minute
			case "kill":
				cfg.OnStop = cluster.StopKill
			default:
				return fmt.Errorf("--on-stop must be keep, pause or kill, not %q", onStop)
			}
			var err error
			if cfg.TrustedProxies, err = parsePrefixes("--trusted-proxies", trustedProxies); err != nil {
				return err
			}
			ctx := cmd.Context()
			if cleanup {
				if err := agent.Cleanup(ctx, cfg.Config); err != nil {
					return err
				}
				cfg.Logger.Info("removed the sandboxes and network slots a stopped server left", "run_dir", cfg.RunDir)
				return nil
			}
			cfg.Trust.ClusterListenDefaulted = !cmd.Flags().Changed("cluster-listen")
			srv, err := server.Start(ctx, cfg)
			if err != nil {
				return err
			}
			return serveUntilDone(ctx, srv.Close, stopTimeout, cfg.Logger, onStop)
		},
	}
	f := cmd.Flags()
	hostFlags(f, &cfg.Config, &hs, &logLevel)
	f.BoolVar(&localNode, "local-node", true, "run a node in this process (the single-host setup); false makes a pure API server for the nodes that join (aenv node)")
	f.StringVar(&clusterTokenFile, "cluster-token-file", "", "file holding the token servers and nodes joined the old way (plain HTTP) authenticate each other with (default: $AENV_CLUSTER_TOKEN, else <data-dir>/secrets/cluster-token, generated on first start)")
	secretFlag(f, "cluster-token")
	f.StringVar(&cfg.Join, "join", "", "join the cluster of the server at this cluster listener, https://SERVER:8443, with a join token of the server role ('aenv cluster join-command --server' prints the command): its etcd, data key and CA are handed over")
	f.StringVar(&cfg.JoinToken, "token", "", "with --join: the join token, short-lived (default: --token-file, else $AENV_JOIN_TOKEN)")
	f.StringVar(&joinTokenFile, "token-file", "", "with --join: file holding the join token")
	f.StringVar(&cfg.CAHash, "ca-hash", "", "with --join: the cluster CA's hash (sha256:...) the server joined must prove it holds")
	f.StringVar(&cfg.Listen, "listen", server.DefaultListen, "address of the API and sandbox proxy: plain HTTP on loopback; beyond it (e.g. :8000) HTTPS, with --tls-cert/--tls-key or a certificate of the cluster's CA ('aenv cluster ca' prints the CA for clients)")
	f.BoolVar(&cfg.InsecureHTTP, "insecure-http", false, "serve the API in plain HTTP beyond loopback too (API keys and sandbox traffic in the clear; for a TLS proxy in front on a trusted network)")
	f.BoolVar(&cfg.HTTPS, "https", false, "serve HTTPS on loopback too")
	f.StringVar(&cfg.Advertise, "advertise", "", "host:port the other servers of a cluster reach this server's local node and its sandboxes at (default: --listen, if it names an address)")
	f.StringVar(&cfg.Trust.ClusterListen, "cluster-listen", server.DefaultClusterListen, "address of the cluster listener (TLS with a certificate of the cluster's CA): nodes join there (aenv cluster join-command), and the other servers reach this server's local node there over mutual TLS; empty: none")
	f.StringVar(&cfg.Trust.ClusterAdvertise, "cluster-advertise", "", "host:port nodes and servers reach the cluster listener at (default: --cluster-listen if it names an address, else --advertise's host)")
	f.StringVar(&cfg.Domain, "domain", "", "domain sandbox hosts are reported under (<port>-<id>.<domain>; default localhost:<port>)")
	f.Float64Var(&cfg.RateLimit, "rate-limit", 100, "control-plane requests per second per client (its API key, else its address; 0: unlimited); over it clients get 429 with Retry-After")
	f.IntVar(&cfg.RateBurst, "rate-burst", 200, "requests a client may send at once before --rate-limit applies")
	f.Float64Var(&cfg.ProxyRateLimit, "proxy-rate-limit", 1000, "requests per second to each sandbox through the proxy (0: unlimited); over it 429 with Retry-After")
	f.IntVar(&cfg.ProxyRateBurst, "proxy-rate-burst", 2000, "requests to one sandbox at once before --proxy-rate-limit applies")
	f.IntVar(&cfg.MaxConnections, "max-connections", server.DefaultMaxConnections, "connections the server holds open at once; past it new ones are closed at once (0: no bound)")
	f.IntVar(&cfg.MaxConnectionsPerClient, "max-connections-per-client", server.DefaultMaxConnectionsPerClient, "connections one client address may hold open (--trusted-proxies are exempt; 0: no bound)")
	f.StringSliceVar(&trustedProxies, "trusted-proxies", nil, "CIDRs of proxies in front of the server whose X-Forwarded-For names the client (for the rate limit)")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "the API's TLS certificate file, with --tls-key (default beyond loopback: a certificate of the cluster's CA for --domain, *.<domain> and this host's names and addresses, renewed in place)")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "the API's TLS private key file")
	f.StringSliceVar(&cfg.EtcdClientURLs, "etcd-listen", nil, "URLs the embedded etcd listens on instead of its unix socket: https://ADDR:PORT (any address; served with a certificate of the cluster's CA, to clients with one: nodes that joined over TLS, each allowed only its own keys) or http on loopback (e.g. http://127.0.0.1:23790)")
	f.StringSliceVar(&cfg.EtcdPeerURLs, "etcd-peer-listen", nil, "URL the embedded etcd listens on for its peers, https://ADDR:PORT (with --etcd-listen at an address they reach): other servers may then join its cluster each with a member of their own (--join with these flags too), three of them a state that outlives any one server")
	f.StringVar(&cfg.EtcdName, "etcd-name", "", "the embedded etcd member's name among its peers, unique in the cluster (default: \"aenv\" for the first server, the hostname for one that joins)")
	f.BoolVar(&cfg.AllowInsecureSandboxes, "allow-insecure-sandboxes", false, "create sandboxes without an envd access token when the client sends secure: false (by default every sandbox has one; the SDKs send it)")
	f.DurationVar(&cfg.PausedRetention, "paused-retention", 0, "delete paused sandboxes (and their snapshots) kept longer than this, e.g. 720h; 0 keeps them until killed")
	f.DurationVar(&cfg.StoreGCInterval, "store-gc-interval", 0, "how often the elected server deletes what nothing in --store refers to any more (chunks, images of deleted templates); default hourly, negative never")
	f.StringVar(&onStop, "on-stop", "keep", "what stopping the server does with running sandboxes: keep (the next start takes them over), pause or kill")
	f.BoolVar(&drain, "drain-on-stop", false, "pause every running sandbox on SIGTERM (same as --on-stop=pause), for a host that is going away")
	f.StringVar(&buildNetwork, "build-network", "sandbox", "network of template build steps: sandbox (a sandbox's open egress) or none")
	f.IntVar(&cfg.BuildMemoryMB, "build-memory", build.DefaultMemoryMB, "memory (MiB) each template build step may use; past it the step is killed and the build fails")
	f.IntVar(&cfg.BuildCPUs, "build-cpus", build.DefaultCPUCount, "CPUs each template build step may use (a quota)")
	f.StringVar(&buildDisk, "build-disk", "20G", "disk each template build writes its tree to (a sparse ext4 image under <data-dir>/builds, removed after the build; bytes, or with K, M, G, T); past it writes fail with ENOSPC and the build fails")
	f.DurationVar(&cfg.BuildTimeout, "build-timeout", build.DefaultTimeout, "time limit of a template build, from when it leaves the queue")
	f.IntVar(&cfg.MaxBuilds, "max-builds", build.DefaultMaxBuilds, "template builds that run at once on this server's node; later ones are queued")
	f.StringVar(&maxImageSize, "max-image-size", "10G", "largest image a pull or a build's FROM may fetch: its layers as stored (compressed) and, apart, what they unpack to (bytes, or with K, M, G, T)")
	f.StringVar(&cfg.RegistryAuth, "registry-auth", "", "registry credentials pulls may use, in Docker's config.json format (default: none; pulls are anonymous)")
	f.BoolVar(&cleanup, "cleanup", false, "do not serve: kill every sandbox a stopped server with these settings left running, remove its network slots, and exit (for uninstalling)")
	return cmd
}

// hostFlags are the settings of whatever runs sandboxes on this host: the
// local node of `aenv server` and `aenv node` alike.
// hostStrings are host flags parsed by hostSettings.
type hostStrings struct {
	egressAllow, dns []string
	imageCacheSize   string
	volumeSize       string
	warmPoolMemory   string
	// fastPath is --systrap-fast-path.
	fastPath string
	// endedHistoryBytes and endedHistoryTeamBytes are sizes.
	endedHistoryBytes, endedHistoryTeamBytes string
	// storeSecretKeyFile holds the S3 secret key.
	storeSecretKeyFile string
	// pprofListen is where Go's profiles are served (empty: nowhere).
	pprofListen string
}

func hostFlags(f *pflag.FlagSet, cfg *agent.Config, hs *hostStrings, logLevel *string) {
	f.StringVar(&cfg.DataDir, "data-dir", defaultDataDir, "durable state: API key, templates")
	f.StringVar(&cfg.RunDir, "run-dir", "/run/aenv", "state that dies with the host: runsc state, network namespaces")
	f.StringVar(&cfg.DataKeyFile, "data-key-file", "", "the cluster's data keys, which seal tokens and environment variables at rest (default: $AENV_DATA_KEY, else <data-dir>/secrets/data-key, generated by the first server; a node that joins is handed it)")
	f.StringVar(&cfg.RunscPath, "runsc", "", "runsc binary (default: from PATH)")
	f.StringVar(&cfg.EnvdPath, "envd", "", "static envd binary (default: beside aenv, then PATH)")
	f.StringVar(&cfg.BaseRootFS, "base-rootfs", os.Getenv("AENV_BASE_ROOTFS"), "prebuilt root filesystem for the base template (env AENV_BASE_ROOTFS)")
	f.StringVar(&cfg.CodeInterpreterRootFS, "code-interpreter-rootfs", os.Getenv("AENV_CODE_INTERPRETER_ROOTFS"), "root filesystem of the code-interpreter template (aenv template build-code-interpreter; env AENV_CODE_INTERPRETER_ROOTFS): serves @e2b/code-interpreter's default template, its sandboxes prestarted in the warm pool")
	f.StringVar(&cfg.SandboxCIDR, "sandbox-cidr", "10.231.0.0/16", "IPv4 range cut into one /30 per sandbox for host-side addresses; each server on a host needs its own (a server refuses one inside which the host already has a network)")
	f.IntVar(&cfg.NetnsPoolSize, "netns-pool", 8, "network namespaces kept ready for new sandboxes")
	f.StringVar(&cfg.StoreURL, "store", os.Getenv("AENV_STORE"), "durable snapshot store: /shared/path, file:///path or s3://bucket/prefix?endpoint=URL&region=R&path_style=true (env AENV_STORE; default: the data dir only)")
	f.StringVar(&cfg.StoreAccessKey, "store-access-key", "", "S3 access key (default: AWS_ACCESS_KEY_ID and the AWS default chain)")
	f.StringVar(&hs.storeSecretKeyFile, "store-secret-key-file", "", "file holding the S3 secret key (default: AWS_SECRET_ACCESS_KEY and the AWS default chain)")
	secretFlag(f, "store-secret-key")
	f.StringVar(&hs.warmPoolMemory, "warm-pool-memory", "", "host memory the warm pool's prestarted sandboxes may take, by what they use (bytes, or with K, M, G, T; default: 5% of --capacity-memory, at most 1G; 0 disables the pool): each template's (and snapshot's) pool is sized to its largest burst of creates within 10 s over the last 5 minutes, refilled one boot at a time while the host is idle, and shrunk under memory pressure")
	f.StringVar(&hs.fastPath, "systrap-fast-path", string(gvisor.FastPathAuto), fmt.Sprintf("whether gVisor's systrap platform spins, rather than sleeps, waiting on a sandbox's syscalls: on cuts a syscall's latency where cores are idle, off keeps bursts of creates from queueing behind spinning threads on small hosts; auto is off below %d CPUs, else on", gvisor.FastPathMinCPUs))
	f.BoolVar(&cfg.RootImages, "root-images", true, "run sandboxes of templates that have a block image (built and pulled ones) from that image, without a gVisor gofer process: 3 MiB less host memory per sandbox and a process less per start; needs aenv's runsc build (scripts/install-deps.sh) and mkfs.erofs. Sandboxes with volumes keep their gofer")
	f.BoolVar(&cfg.BaseRootImage, "base-root-image", true, "with --root-images, run base's sandboxes without a gofer too (4 MiB less host memory each), from an image of its tree made beside it at start (~1 s, once). Every host builds its own base, and a sandbox restores only from the image it was saved on: its first snapshot puts that image into --store (~200 MB, once), where other hosts read it. Without a store, turn it off where base sandboxes migrate between hosts")
	f.IntVar(&cfg.WarmPoolMax, "warm-pool-max", 0, "most sandboxes kept prestarted of any one template or snapshot, whatever its demand (0: only --warm-pool-memory bounds it)")
	f.IntVar(&cfg.MaxBoots, "max-boots", 0, "sandboxes booting or restoring at once; later ones wait their turn, since boots are CPU-bound and a burst started all at once is all late (0: two per CPU of --capacity-cpu; negative: no bound)")
	f.IntVar(&cfg.WarmPoolFloor, "warm-pool", 1, "base (and code-interpreter) sandboxes kept prestarted even without recent creates, and as many prepared for their resumes and forks (their processes started, no state loaded), within --warm-pool-memory (the pool grows past it with demand; 0: no floor)")
	f.StringVar(&hs.endedHistoryBytes, "ended-history-bytes", "512M", "what this node keeps of the logs and metrics of sandboxes that ended, compressed, in <data-dir>/ended-history (bytes, or with K, M, G, T): the oldest go first past it, and each at --ended-history-retention")
	f.StringVar(&hs.endedHistoryTeamBytes, "ended-history-team-bytes", "", "the share of --ended-history-bytes one team's ended sandboxes may take (default: a quarter of it)")
	f.DurationVar(&cfg.EndedHistoryRetention, "ended-history-retention", node.DefaultEndedHistoryRetention, "how long the logs and metrics of a sandbox that ended are kept on the node that ran it")
	f.StringVar(&cfg.NetnsTag, "netns-tag", "aenv", "names this node's nftables tables and host interfaces (lower-case letters; distinct per server or node on one host)")
	f.StringSliceVar(&cfg.EtcdEndpoints, "etcd-endpoints", nil, "external etcd cluster for the live state (URL[,URL...]; a server's default is an embedded member in <data-dir>/etcd; a node needs these or --join)")
	f.StringVar(&cfg.EtcdCAFile, "etcd-ca", "", "CA certificate to verify --etcd-endpoints")
	f.StringVar(&cfg.EtcdCertFile, "etcd-cert", "", "client certificate for --etcd-endpoints")
	f.StringVar(&cfg.EtcdKeyFile, "etcd-key", "", "client key for --etcd-endpoints")
	f.StringSliceVar(&hs.dns, "dns", nil, "resolvers sandboxes use (IPv4 addresses; default: the host's, from /etc/resolv.conf)")
	f.StringSliceVar(&hs.egressAllow, "egress-allow", nil, "CIDR of the host's own networks that sandboxes may reach after all (they never reach the host's networks otherwise; the private and special ranges, and the cluster's members, stay blocked)")
	f.IntVar(&cfg.PidsLimit, "pids-limit", 1024, "host tasks each sandbox may take (plus gVisor's own); each user in it may run two fifths as many processes and threads, as gVisor runs two host tasks per guest process, and past that fork fails with EAGAIN inside (templates may set their own)")
	f.IntVar(&cfg.DiskMB, "disk-size", node.DefaultDiskMB, "each sandbox's disk in MiB, unless its template sets one: its files go to a sparse file on the host's disk, and past it writes fail with ENOSPC (-1 keeps files in the sandbox's memory)")
	f.StringVar(&hs.volumeSize, "volume-size", "10G", "size of a volume created without one (bytes, or with K, M, G, T): an ext4 image, sparse on the host's disk, past which writes fail with ENOSPC (0: plain directories, unbounded)")
	f.Float64Var(&cfg.Capacity.DiskHighWater, "disk-high-water", capacity.DefaultDiskHighWater, "refuse creates (503, Retry-After) while the disk under --run-dir is fuller than this fraction")
	f.IntVar(&cfg.PidsTotal, "pids-limit-total", 0, "host tasks all sandboxes together may run (default: 3/4 of kernel.pid_max)")
	f.IntVar(&cfg.Capacity.MemoryMB, "capacity-memory", 0, "memory (MiB) this host offers sandboxes; larger sandboxes are refused (default: physical memory)")
	f.IntVar(&cfg.Capacity.CPUCount, "capacity-cpu", 0, "CPUs this host offers; sandboxes with more are refused (default: the host's; CPU is overcommitted freely and enforced by quota)")
	f.Float64Var(&cfg.Capacity.MemoryOvercommit, "memory-overcommit", capacity.DefaultMemoryOvercommit, "sandboxes' configured memory may add up to this multiple of --capacity-memory; past it creates get 503 with Retry-After")
	f.Float64Var(&cfg.Capacity.MemoryHighWater, "memory-high-water", capacity.DefaultMemoryHighWater, "refuse creates (503, Retry-After) while the host's real memory use is above this fraction (and, with --pause-under-pressure, pause the idlest sandbox)")
	f.DurationVar(&cfg.Idle.After, "idle-pause", 0, "pause a sandbox that has had no network traffic (commands, files, its ports, its own egress) and used under --idle-cpu of its CPUs for this long; its next request resumes it, with the deadline it had (0: never; make it longer than a minute, as an open command stream's keepalives count as traffic and a pause cuts connections the sandbox holds)")
	f.Float64Var(&cfg.Idle.CPUPercent, "idle-cpu", node.DefaultIdleCPUPercent, "CPU use, in percent of a sandbox's CPUs over 5 s, from which it counts as busy for --idle-pause and --pause-under-pressure, traffic or not")
	f.BoolVar(&cfg.Idle.UnderPressure, "pause-under-pressure", true, "while the host's real memory use is above --memory-high-water, pause the idlest sandbox (quiet for 30 s at least) every 5 s, rather than wait for the kernel's OOM killer; its next request resumes it")
	f.StringVar(&cfg.RootFS, "rootfs", agent.RootFSImage, "how sandboxes get their template's files: image (its block image, read on demand from --store into the image cache by the node's image server, which outlives restarts), eager (the block image fetched whole first) or dir (the template's tree, copied whole)")
	f.StringVar(&hs.imageCacheSize, "image-cache-size", "", "bound of this node's image cache in <data-dir>/image-cache, least recently used chunks evicted (bytes, or with K, M, G, T; default: 20% of the disk)")
	f.DurationVar(&cfg.ImageGrace, "image-grace", blockimage.DefaultGrace, "how long a block image no sandbox uses stays mounted")
	f.BoolVar(&cfg.InsecureCluster, "insecure-cluster", false, "allow cluster traffic in plain HTTP off loopback: the old join with the cluster token, a node API without TLS, etcd over http, served (--etcd-listen) or reached (logged as a warning at every start; for a trusted network only)")
	f.StringVar(logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&hs.pprofListen, "pprof-listen", "", "loopback address to serve Go's profiles at (/debug/pprof/; e.g. 127.0.0.1:6060), for finding what a long run keeps in memory; empty: none")
}

// hostSettings applies what hostFlags parsed that needs parsing.
func hostSettings(cfg *agent.Config, hs hostStrings, logLevel string) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	for _, d := range hs.dns {
		a, err := netip.ParseAddr(d)
		if err != nil || !a.Is4() {
			return fmt.Errorf("--dns %q: not an IPv4 address", d)
		}
		cfg.DNSServers = append(cfg.DNSServers, a)
	}
	fp, err := gvisor.ParseFastPath(hs.fastPath)
	if err != nil {
		return fmt.Errorf("--systrap-fast-path: %w", err)
	}
	cfg.FastPath = fp
	if hs.imageCacheSize != "" {
		n, err := parseBytes(hs.imageCacheSize)
		if err != nil {
			return fmt.Errorf("--image-cache-size: %w", err)
		}
		cfg.ImageCacheSize = n
	}
	n, err := parseBytes(hs.volumeSize)
	if err != nil {
		return fmt.Errorf("--volume-size: %w", err)
	}
	if cfg.VolumeSize = n; n == 0 {
		cfg.VolumeSize = -1
	}
	if hs.warmPoolMemory != "" {
		n, err := parseBytes(hs.warmPoolMemory)
		if err != nil {
			return fmt.Errorf("--warm-pool-memory: %w", err)
		}
		if cfg.WarmPoolMemory = n; n == 0 {
			cfg.WarmPoolMemory = -1
		}
	}
	for _, f := range []struct {
		name, val string
		dst       *int64
	}{{"--ended-history-bytes", hs.endedHistoryBytes, &cfg.EndedHistoryBytes},
		{"--ended-history-team-bytes", hs.endedHistoryTeamBytes, &cfg.EndedHistoryTeamBytes}} {
		if f.val == "" {
			continue
		}
		n, err := parseBytes(f.val)
		if err != nil || n == 0 {
			return fmt.Errorf("%s: %q is not a size above 0 (bytes, or with K, M, G, T)", f.name, f.val)
		}
		*f.dst = n
	}
	if hs.storeSecretKeyFile != "" {
		if cfg.StoreSecretKey, err = readSecretFile("--store-secret-key-file", hs.storeSecretKeyFile); err != nil {
			return err
		}
	}
	if cfg.EgressAllow, err = parsePrefixes("--egress-allow", hs.egressAllow); err != nil {
		return err
	}
	return servePprof(hs.pprofListen, cfg.Logger)
}

// parsePrefixes parses the CIDRs given to flag.
func parsePrefixes(flag string, vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, a := range vals {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return nil, fmt.Errorf("%s %q: %w", flag, a, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// serveUntilDone waits for ctx (a signal) and then stops what runs, within
// timeout.
func serveUntilDone(ctx context.Context, stop func(context.Context) error, timeout time.Duration, log *slog.Logger, onStop string) error {
	<-ctx.Done()
	log.Info("shutting down", "sandboxes", onStop)
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return stop(sctx)
}
