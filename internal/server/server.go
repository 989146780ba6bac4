// Package server wires one aenv server process together: the API and proxy
// in front, the cluster behind them, and (in the single-host default) an
// in-process node with its runtime, network and templates. It is the only
// package that knows every layer; cmd/aenv's server command calls it.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/proxy"
	"github.com/aenvhq/aenv/internal/runtime/gvisor"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/volume"
)

// Config is everything `aenv server` can be told.
type Config struct {
	// Listen is the HTTP address of the API and proxy.
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
	// BuildMemoryMB and BuildCPUs bound each build step, BuildDiskBytes
	// the disk a build's tree is written to, BuildTimeout a build's time
	// (0: 2 GiB, 2 CPUs, 20 GiB, 30 minutes; negative: no bound); its
	// steps' pids are bounded as sandboxes' (PidsLimit). MaxBuilds is how
	// many builds run at once on the local node, the others queued (0:
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
	// DNSServers, when set, are the resolvers sandboxes use instead of
	// the host's (/etc/resolv.conf).
	DNSServers []netip.Addr
	// CodeInterpreterRootFS, when set, is the tree of the code-interpreter
	// template (aenv template build-code-interpreter), served as
	// code-interpreter-v1 and kept in the warm pool beside base.
	CodeInterpreterRootFS string
	// SandboxCIDR is cut into one /30 per sandbox for host-side addresses.
	SandboxCIDR string
	// Domain is what clients are told sandbox hosts end in; empty derives
	// `localhost:<port>` from Listen.
	Domain string
	// APIKey overrides the key stored in DataDir.
	APIKey string
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
	// RateLimit and RateBurst bound control-plane requests per client:
	// its API key, or its address (requests per second; 0 disables).
	RateLimit float64
	RateBurst int
	// ProxyRateLimit and ProxyRateBurst bound requests to each sandbox
	// through the proxy (per second; 0 disables).
	ProxyRateLimit float64
	ProxyRateBurst int
	// TrustedProxies are proxies in front of the server whose
	// X-Forwarded-For names the client (and which MaxConnectionsPerClient
	// does not bound).
	TrustedProxies []netip.Prefix
	// MaxConnections and MaxConnectionsPerClient bound the connections
	// the API listener holds open, in all and per client address; past
	// them new connections are closed at once (0: no bound).
	MaxConnections, MaxConnectionsPerClient int
	// TLSCert and TLSKey, when both set, make the server speak HTTPS.
	TLSCert, TLSKey string
	// WarmPoolSize is how many base sandboxes are kept prestarted.
	WarmPoolSize int
	// NetnsTag names this server's nftables tables and host interfaces, so
	// that several servers can share a host.
	NetnsTag string
	// Limits bound clients' requests.
	Limits cluster.Limits
	// EtcdEndpoints name an external etcd cluster for the live state;
	// empty runs an embedded member in <data-dir>/etcd, reached through a
	// unix socket in the run directory.
	EtcdEndpoints []string
	// EtcdCAFile, EtcdCertFile and EtcdKeyFile are TLS for EtcdEndpoints.
	EtcdCAFile, EtcdCertFile, EtcdKeyFile string
	// EtcdClientURLs make the embedded member listen on these loopback
	// URLs instead of its unix socket (to back up or inspect it with
	// etcdctl, or to let a second server share it).
	EtcdClientURLs []string
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
	// PausedRetention, when positive, is how long paused sandboxes are
	// kept before they are deleted with their snapshots; 0 keeps them.
	PausedRetention time.Duration
	// StoreGCInterval is how often the elected server collects the
	// store's garbage (chunks and images nothing refers to); 0 means
	// hourly, negative never.
	StoreGCInterval time.Duration
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
	// AllowInsecureSandboxes lets clients create sandboxes without an
	// envd access token (secure: false); by default every sandbox has one.
	AllowInsecureSandboxes bool
	// Capacity is what the local node admits (zero fields: the host's
	// memory and CPUs, overcommit 4, high-water 90%).
	Capacity node.Capacity
	// OnStop says what stopping the server does with running sandboxes:
	// keep them for the next start (the default), pause them, or kill them.
	OnStop cluster.StopMode
	// NoLocalNode makes a pure API server: no node runs in its process,
	// and it serves the API and proxy for the node agents that join
	// (`aenv node`). By default a server runs one (the single-host setup).
	NoLocalNode bool
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
	// dataKeys are the keys loaded from there, for the snapshot catalog.
	dataKeys *sealed.Keyring
	// Join is a server's URL a node agent asks for the cluster's etcd
	// endpoints (instead of EtcdEndpoints).
	Join string
	// Advertise is the host:port servers reach a node agent at.
	Advertise string
	Logger    *slog.Logger
}

// Server is a running aenv server.
type Server struct {
	cfg      Config
	log      *slog.Logger
	http     *http.Server
	listener net.Listener
	cluster  *cluster.Cluster
	// host is the in-process node's (nil with LocalNode off).
	host      *host
	templates *template.Store
	state     *state.Etcd
	// registration keeps the in-process node in the cluster's registry.
	registration *cluster.Registration
	apiKey       string
	keys         *apikeys.Store
	api          *api.Server
	// remote is a pure API server's store (a local node has its own).
	remote *store.Store
	// images is the store block images are published to (beside remote).
	images *store.Store

	// stopGC ends the store's garbage collection loop.
	stopGC func()
	// stopSweep ends the build files' sweep and waits for it.
	stopSweep func()

	closeOnce sync.Once
	closeErr  error
	// token is the cluster token; nodeTransport carries it to nodes.
	token         string
	nodeTransport http.RoundTripper
}

// withDefaults fills in the zero fields of cfg.
func (cfg Config) withDefaults() Config {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Listen == "" {
		cfg.Listen = ":8000"
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

// Start sets everything up and starts serving; Close undoes it. Start
// fails with a clear error, leaving nothing behind, when a prerequisite is
// missing.
func Start(ctx context.Context, cfg Config) (srv *Server, err error) {
	cfg = cfg.withDefaults()
	log := cfg.Logger
	s := &Server{cfg: cfg, log: log}
	defer func() {
		if err != nil {
			s.Close(context.WithoutCancel(ctx))
		}
	}()

	if s.apiKey, err = loadAPIKey(cfg.DataDir, cfg.APIKey, log); err != nil {
		return nil, err
	}
	if s.state, err = openState(ctx, cfg, log); err != nil {
		return nil, err
	}
	if s.token, err = loadClusterToken(cfg.DataDir, cfg.ClusterToken, true, log); err != nil {
		return nil, err
	}
	if err := cluster.CheckToken(ctx, s.state, s.token, true); err != nil {
		return nil, fmt.Errorf("this server's cluster token (%s or $%s): %w", ClusterTokenPath(cfg.DataDir), ClusterTokenEnv, err)
	}
	keys, err := loadDataKeys(cfg.DataDir, cfg.DataKeyFile, true, log)
	if err != nil {
		return nil, err
	}
	if err := checkDataKeys(ctx, s.state, keys, true); err != nil {
		return nil, err
	}
	cfg.dataKeys, s.cfg.dataKeys = keys.keys, keys.keys
	s.nodeTransport = nodeapi.Transport(s.token)
	if s.keys, err = apikeys.Open(ctx, s.state, log); err != nil {
		return nil, err
	}
	// Every server of the cluster accepts this server's key too, unless
	// an admin revoked it.
	if _, err := s.keys.Ensure(ctx, s.apiKey, "server "+cfg.DataDir); errors.Is(err, apikeys.ErrRevoked) {
		log.Warn("this server's own API key was revoked; it is not added again", "path", APIKeyPath(cfg.DataDir), "err", err)
	} else if err != nil {
		return nil, fmt.Errorf("recording this server's API key: %w", err)
	}
	if !cfg.NoLocalNode {
		if s.host, err = openHost(ctx, cfg, log); err != nil {
			return nil, err
		}
		s.templates = s.host.templates
	} else {
		// A pure API server lists the templates of the store the nodes
		// share, and pulls templates into it.
		if s.remote, s.images, err = openRemote(ctx, cfg, log); err != nil {
			return nil, err
		}
		if s.templates, err = openTemplates(cfg, s.remote, s.images, log); err != nil {
			return nil, err
		}
	}
	prx := proxy.New(s, http.Header{nodeapi.TokenHeader: {s.token}}, log)
	hostname, _ := os.Hostname()
	ccfg := cluster.Config{
		Dial:            s.dial,
		State:           s.state,
		Limits:          cfg.Limits,
		OnGone:          prx.Forget,
		LegacyStateDir:  cfg.DataDir,
		PausedRetention: cfg.PausedRetention,
		TeamLimits:      api.TeamLimits(s.keys),
		// One server per data directory on a host: its restarted self has
		// the same name, whatever port it listens on.
		Candidate: hostname + ":" + cfg.DataDir,
		DataKeys:  cfg.dataKeys,
		Logger:    log,
	}
	if s.host != nil {
		ccfg.Local = s.host.api
	}
	if s.cluster, err = cluster.Open(ctx, ccfg); err != nil {
		return nil, err
	}
	if remote := s.storeOf(); remote != nil && cfg.StoreGCInterval >= 0 {
		interval := cfg.StoreGCInterval
		if interval == 0 {
			interval = DefaultStoreGCInterval
		}
		gcCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
		s.stopGC = stop
		go s.collectLoop(gcCtx, remote, interval)
	}
	if s.host != nil {
		if s.registration, err = cluster.RegisterNode(ctx, s.state, cluster.Reporter(s.host.api, ""), log); err != nil {
			return nil, err
		}
	}

	s.listener, err = net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	s.listener = newLimitListener(s.listener, cfg.MaxConnections, cfg.MaxConnectionsPerClient, cfg.TrustedProxies, log)
	domain := cfg.Domain
	if domain == "" {
		domain = "localhost:" + portOf(s.listener.Addr())
	}
	acfg := api.Config{
		Cluster:        s.cluster,
		Templates:      s.templates,
		Proxy:          prx,
		Keys:           s.keys,
		RateLimit:      cfg.RateLimit,
		RateBurst:      cfg.RateBurst,
		ProxyRateLimit: cfg.ProxyRateLimit,
		ProxyRateBurst: cfg.ProxyRateBurst,
		TrustedProxies: cfg.TrustedProxies,
		Domain:         domain,
		AllowInsecure:  cfg.AllowInsecureSandboxes,
		Logger:         log,
	}
	if s.host != nil {
		acfg.BuildSteps = s.host.node
		if s.host.imageServer != nil {
			acfg.Metrics = s.host.imageServer
		}
	}
	if err := setBuildBounds(&acfg, cfg, s.host != nil); err != nil {
		return nil, err
	}
	acfg.BuildLimiter = api.TeamBuilds(s.keys)
	acfg.VolumeContent = s.volumeContent
	// Pulls need no node: the image is unpacked here and published to the
	// store, from which nodes fetch it. Without a store only a local node
	// could use it.
	acfg.Pulls = s.host != nil || s.remote != nil
	s.api = api.New(acfg)
	s.stopSweep = sweepBuildFiles(s.api, log)
	handler := s.withJoin(s.api)
	s.http = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		// Idle keep-alive connections are closed; streams are not idle
		// (envd sends keepalives on them).
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
	}
	tls := cfg.TLSCert != "" && cfg.TLSKey != ""
	go func() {
		var err error
		if tls {
			err = s.http.ServeTLS(s.listener, cfg.TLSCert, cfg.TLSKey)
		} else {
			err = s.http.Serve(s.listener)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving HTTP", "err", err)
		}
	}()
	log.Info("aenv server listening", "addr", s.listener.Addr().String(), "tls", tls, "domain", domain, "local_node", s.host != nil)
	return s, nil
}

// openState opens the live state: the external etcd cluster, waiting
// (with backoff, logging why) until it answers, or the embedded member.
func openState(ctx context.Context, cfg Config, log *slog.Logger) (*state.Etcd, error) {
	start := time.Now()
	st, err := state.Open(ctx, state.Config{
		Endpoints: cfg.EtcdEndpoints,
		CAFile:    cfg.EtcdCAFile, CertFile: cfg.EtcdCertFile, KeyFile: cfg.EtcdKeyFile,
		DataDir:    filepath.Join(cfg.DataDir, "etcd"),
		SocketDir:  cfg.RunDir,
		ClientURLs: cfg.EtcdClientURLs,
		Logger:     log,
	})
	if err != nil {
		return nil, fmt.Errorf("opening the state store: %w", err)
	}
	if err := st.WaitReady(ctx); err != nil {
		st.Close()
		return nil, fmt.Errorf("waiting for the state store: %w", err)
	}
	log.Info("state store ready", "etcd", strings.Join(st.Endpoints(), ","), "embedded", len(cfg.EtcdEndpoints) == 0,
		"took_ms", time.Since(start).Milliseconds())
	return st, nil
}

// SandboxRoute implements proxy.Resolver.
func (s *Server) SandboxRoute(ctx context.Context, id string) (proxy.Route, error) {
	r, err := s.cluster.Route(ctx, id)
	if errors.Is(err, cluster.ErrConflict) {
		// Paused: traffic resumes it if it asked for that. The resume
		// finishes even if this client goes: the next one finds it running.
		if ok, rerr := s.cluster.AutoResume(context.WithoutCancel(ctx), id); rerr != nil {
			s.log.Warn("resuming a sandbox for its traffic", "sandbox_id", id, "err", rerr)
		} else if ok {
			r, err = s.cluster.Route(ctx, id)
		}
	}
	return proxy.Route{Addr: r.Addr, Via: r.Via, TrafficToken: r.TrafficToken, MaskRequestHost: r.MaskRequestHost}, err
}

// storeOf is the cluster's store as this server opened it (nil: none).
func (s *Server) storeOf() *store.Store {
	if s.host != nil {
		return s.host.remote
	}
	return s.remote
}

// dial reaches a node agent with the cluster token.
func (s *Server) dial(id, address string) nodeapi.Node {
	return nodeapi.Dial(id, address, s.nodeTransport)
}

// Addr returns the address the server listens on.
func (s *Server) Addr() net.Addr { return s.listener.Addr() }

// APIKey returns the key clients must present.
func (s *Server) APIKey() string { return s.apiKey }

// Close stops serving. Running sandboxes keep running for the next start
// unless Config.OnStop says to pause or kill them.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { s.closeErr = s.close(ctx) })
	return s.closeErr
}

func (s *Server) close(ctx context.Context) error {
	var errs []error
	if s.stopGC != nil {
		s.stopGC()
	}
	if s.stopSweep != nil {
		s.stopSweep()
	}
	if s.http != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.http.Shutdown(sctx); err != nil {
			s.http.Close()
		}
		cancel()
	} else if s.listener != nil {
		s.listener.Close()
	}
	if s.registration != nil {
		s.registration.Stop()
		// A node that keeps its sandboxes for the next start stays
		// registered until its lease runs out; one that ends them goes.
		if s.cfg.OnStop != cluster.StopKeep {
			if err := cluster.DeregisterNode(ctx, s.state, s.host.node.ID()); err != nil {
				s.log.Warn("deregistering node", "err", err)
			}
		}
	}
	if s.cluster != nil {
		errs = append(errs, s.cluster.Close(ctx, s.cfg.OnStop))
	}
	if s.host != nil {
		errs = append(errs, s.host.close(ctx, s.cfg.OnStop))
	}
	if s.keys != nil {
		s.keys.Close()
	}
	if s.images != nil {
		errs = append(errs, s.images.Close())
	}
	if s.remote != nil {
		errs = append(errs, s.remote.Close())
	}
	if s.state != nil {
		errs = append(errs, s.state.Close())
	}
	return errors.Join(errs...)
}

func addrStrings(as []netip.Addr) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	return out
}

func portOf(a net.Addr) string {
	_, port, _ := net.SplitHostPort(a.String())
	return port
}

// findEnvd locates the envd binary: explicit path, else beside this
// executable (bin/aenv and bin/envd ship together), else PATH.
func findEnvd(explicit string) (string, error) {
	if explicit != "" {
		if _, err := os.Stat(explicit); err != nil {
			return "", fmt.Errorf("finding envd: %w", err)
		}
		return filepath.Abs(explicit)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "envd")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, "envd")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("finding envd: no envd binary beside aenv or in PATH (build it with `make build`, or pass --envd)")
}

// ensureBase builds the base template on first start.
func ensureBase(ctx context.Context, ts *template.Store, log *slog.Logger) error {
	if _, err := ts.Get(template.BaseID); err == nil {
		return nil
	}
	dest := ts.BaseRootFS()
	log.Info("building the base template from Debian packages (first start only; a few minutes)", "dir", dest)
	start := time.Now()
	w := &logWriter{log: log}
	if err := template.BuildBase(ctx, dest, template.BuildOptions{Log: w}); err != nil {
		return err
	}
	log.Info("base template built", "dir", dest, "took", time.Since(start).Round(time.Second))
	return nil
}

// logWriter turns a tool's output lines into debug logs.
type logWriter struct{ log *slog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	for _, line := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		if line != "" {
			w.log.Debug(line, "component", "debootstrap")
		}
	}
	return len(p), nil
}

// Cleanup removes every sandbox and network slot that a stopped server
// with this configuration left running on the host (sandboxes outlive
// their server; see Config.OnStop), for uninstalling. It refuses while a
// server uses the same run directory.
func Cleanup(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	prefix, err := netip.ParsePrefix(cfg.SandboxCIDR)
	if err != nil {
		return fmt.Errorf("parsing sandbox CIDR %q: %w", cfg.SandboxCIDR, err)
	}
	netCfg := netns.Config{RunDir: filepath.Join(cfg.RunDir, "netns"), Prefix: prefix, Tag: cfg.NetnsTag, Logger: cfg.Logger}
	// Reap fails with ErrBusy while a server holds the run directory:
	// check that before touching its sandboxes.
	if err := netns.Reap(ctx, netCfg); err != nil {
		return fmt.Errorf("cleaning up: %w", err)
	}
	// No server holds the run directory: once its sandboxes are gone
	// (below), so goes the image server serving their roots, and what a
	// killed one left mounted, whatever else fails.
	images := filepath.Join(cfg.RunDir, "images")
	defer func() {
		if err := blockimage.NewClient(filepath.Join(images, "server.sock")).Stop(ctx); err != nil {
			cfg.Logger.Warn("stopping the image server", "err", err)
		}
		blockimage.Sweep(filepath.Join(images, "mounts"), cfg.Logger)
	}()
	// Without PidsTotal: cleaning up must not set the host's limits.
	driver, err := gvisor.New(gvisorConfig(cfg, cfg.Logger))
	if err != nil {
		return fmt.Errorf("cleaning up: %w", err)
	}
	errs := []error{driver.Cleanup(ctx), driver.Close()}
	overlays := filepath.Join(cfg.RunDir, "node", "rootfs")
	entries, _ := os.ReadDir(overlays)
	for _, e := range entries {
		errs = append(errs, node.ReleaseOverlay(overlays, e.Name()))
	}
	errs = append(errs, os.RemoveAll(filepath.Join(cfg.RunDir, "node")))
	// The volumes' images, mounted while the server ran, no sandbox uses
	// now.
	if vols := filepath.Join(cfg.DataDir, "volumes"); cfg.DataDir != "" {
		if _, err := os.Stat(vols); err == nil {
			d, err := volume.Open(vols)
			if err == nil {
				err = d.UnmountAll()
			}
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up: %w", err)
	}
	return nil
}

// volumeContent is the data plane of the volumes of node nodeID: this
// host's files, or the node's own data plane (behind the cluster token).
func (s *Server) volumeContent(nodeID string) (http.Handler, error) {
	addr, ok := s.cluster.NodeAddress(nodeID)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: node %s, which holds the volume, is not reachable", cluster.ErrUnavailable, nodeID)
	case addr == "" && s.host != nil:
		return s.host.volumes.Content(), nil
	case addr == "":
		return nil, fmt.Errorf("%w: node %s runs inside another server", cluster.ErrUnavailable, nodeID)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: addr})
			pr.Out.Header.Del("Authorization") // the volume's token stays here
		},
		Transport: s.nodeTransport,
	}, nil
}
