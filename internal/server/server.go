// Package server wires one aenv server process together: the API and proxy
// in front, the cluster behind them, and (in the single-host default) an
// in-process node with its runtime, network and templates. It is the only
// package that knows every layer; cmd/aenv's server command calls it.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/buildjob"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/console"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/proxy"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
)

// Config is everything `aenv server` can be told: what its in-process
// node (and any node agent) is told, and the API's own settings.
type Config struct {
	agent.Config
	// Domain is what clients are told sandbox hosts end in; empty derives
	// `localhost:<port>` from Listen.
	Domain string
	// APIKey overrides the key stored in DataDir.
	APIKey string
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
	// TLSCert and TLSKey are the API's certificate and key files. Without
	// them the API serves plain HTTP on loopback, and beyond it HTTPS
	// with a certificate of the cluster's CA (see apiTLS).
	TLSCert, TLSKey string
	// InsecureHTTP serves the API in plain HTTP beyond loopback.
	InsecureHTTP bool
	// HTTPS serves the API over TLS on loopback too.
	HTTPS bool
	// Limits bound clients' requests.
	Limits cluster.Limits
	// PausedRetention, when positive, is how long paused sandboxes are
	// kept before they are deleted with their snapshots; 0 keeps them.
	PausedRetention time.Duration
	// StoreGCInterval is how often the elected server collects the
	// store's garbage (chunks and images nothing refers to); 0 means
	// hourly, negative never.
	StoreGCInterval time.Duration
	// AllowInsecureSandboxes lets clients create sandboxes without an
	// envd access token (secure: false); by default every sandbox has one.
	AllowInsecureSandboxes bool
	// NoLocalNode makes a pure API server: no node runs in its process,
	// and it serves the API and proxy for the node agents that join
	// (`aenv node`). By default a server runs one (the single-host setup).
	NoLocalNode bool
	// Trust is the cluster listener and the certificates' lifetime.
	Trust TrustConfig
	// JoinToken is the join token (of the server role) a server given
	// agent.Config.Join (https, with CAHash) joins the cluster with
	// (default: $AENV_JOIN_TOKEN); a restart after the join needs none.
	JoinToken string
	// dataKeys are the data keys loaded (agent.Config.DataKeyFile), for
	// the snapshot catalog and the records.
	dataKeys *sealed.Keyring
	// wrapNode, when set, wraps the node API of every node this server
	// dials: the seam where this package's tests cut a node's streams.
	wrapNode func(nodeapi.Node) nodeapi.Node
}

// DefaultListen is where the API listens unless told otherwise: loopback,
// in plain HTTP, for the single-host setup; listening beyond it serves
// HTTPS (see Config.TLSCert).
const DefaultListen = "127.0.0.1:8000"

// Server is a running aenv server.
type Server struct {
	cfg      Config
	log      *slog.Logger
	http     *http.Server
	listener net.Listener
	cluster  *cluster.Cluster
	// host is the in-process node's (nil with LocalNode off).
	host      *agent.Host
	templates *template.Catalog
	state     *state.Etcd
	// registration keeps the in-process node in the cluster's registry.
	registration *membership.Registration
	apiKey       string
	keys         *apikeys.Keys
	api          *api.Handler
	// remote is a pure API server's store (a local node has its own).
	remote *store.Repository
	// images is the store block images are published to (beside remote).
	images *store.Repository

	// builds are the cluster's template builds, this server's running.
	builds *buildjob.Jobs

	// stopGC ends the store's garbage collection loop.
	stopGC func()
	// stopSweep ends the build files' sweep and waits for it.
	stopSweep func()

	closeOnce sync.Once
	closeErr  error
	// token is the cluster token; nodeTransport carries it to nodes.
	token         string
	nodeTransport http.RoundTripper
	// trust holds the CA and this server's certificate; the cluster
	// listener (nil: none) serves joins and the local node over TLS.
	trust *trust
	// etcdTLS are the certificates of an etcd served with the cluster's
	// CA (nil: it is not), which has RBAC: joins grant nodes their etcd
	// users, removals take them away.
	etcdTLS          *membership.EtcdTLS
	clusterListener  net.Listener
	clusterHTTP      *http.Server
	clusterAdvertise string
	// serverRegistration keeps this server's own record (nil: it has no
	// address to tell).
	serverRegistration *membership.Registration
}

// withDefaults fills in the zero fields of cfg.
func (cfg Config) withDefaults() Config {
	cfg.Config = cfg.Config.WithDefaults()
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
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
	if cfg.Join != "" {
		if err := joinAsServer(ctx, &cfg, log); err != nil {
			return nil, err
		}
		s.cfg = cfg
	}
	if s.etcdTLS, err = openEtcdTLS(cfg, log); err != nil {
		return nil, err
	}
	if s.state, err = agent.OpenState(ctx, cfg.Config, agent.StateTLS{Member: s.etcdTLS.MemberTLS(), Client: s.etcdTLS.ClientTLS()}, log); err != nil {
		return nil, err
	}
	if s.etcdTLS != nil {
		// Before anything is written: from then on a client's
		// certificate is its etcd user, and nodes' reach only their keys.
		if err := s.state.EnableAuth(ctx, membership.EtcdServerUser); err != nil {
			return nil, err
		}
	}
	if s.token, err = membership.LoadClusterToken(cfg.DataDir, cfg.ClusterToken, true, log); err != nil {
		return nil, err
	}
	if err := membership.CheckToken(ctx, s.state, s.token, true); err != nil {
		return nil, fmt.Errorf("this server's cluster token (%s or $%s): %w", membership.ClusterTokenPath(cfg.DataDir), membership.ClusterTokenEnv, err)
	}
	keys, err := membership.LoadDataKeys(cfg.DataDir, cfg.DataKeyFile, true, log)
	if err != nil {
		return nil, err
	}
	if err := membership.CheckDataKeys(ctx, s.state, keys, true); err != nil {
		return nil, err
	}
	cfg.dataKeys, s.cfg.dataKeys = keys.Keys, keys.Keys
	s.nodeTransport = nodeapi.Transport(s.token)
	localNodeID := ""
	if !cfg.NoLocalNode {
		localNodeID = cfg.NodeID
	}
	if s.trust, err = openTrust(ctx, s.state, cfg, localNodeID, s.nodeTransport, log); err != nil {
		return nil, err
	}
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
		// Its sandboxes are kept off the cluster's members, this server
		// included.
		cfg.Config.Cluster = s.state
		if s.host, err = agent.OpenHost(ctx, cfg.Config, cfg.dataKeys, log); err != nil {
			return nil, err
		}
		s.templates = s.host.Templates()
	} else {
		// A pure API server lists the templates of the store the nodes
		// share, which nodes pull templates into.
		if s.remote, s.images, err = agent.OpenStore(ctx, cfg.Config, log); err != nil {
			return nil, err
		}
		if s.templates, err = agent.OpenTemplates(cfg.Config, s.remote, s.images, log); err != nil {
			return nil, err
		}
	}
	prx := proxy.New(s, http.Header{nodeapi.TokenHeader: {s.token}}, log)
	prx.SetVia(viaDialer{t: s.trust, token: http.Header{nodeapi.TokenHeader: {s.token}}})
	hostname, _ := os.Hostname()
	ccfg := cluster.Config{
		Dial:            s.dial,
		State:           s.state,
		Limits:          cfg.Limits,
		OnGone:          prx.Forget,
		LegacyStateDir:  cfg.DataDir,
		PausedRetention: cfg.PausedRetention,
		KilledRetention: cfg.EndedHistoryRetention,
		TeamLimits:      api.TeamLimits(s.keys),
		// One server per data directory on a host: its restarted self has
		// the same name, whatever port it listens on.
		Candidate: hostname + ":" + cfg.DataDir,
		DataKeys:  cfg.dataKeys,
		Logger:    log,
	}
	if s.host != nil {
		ccfg.Local = s.host.API()
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
		acfg.Metrics = s.host.Metrics()
	}
	// Builds run on a node and publish there: their templates reach
	// this server's clients with a local node, or through a store the
	// nodes share, as pulls' do.
	if s.host != nil || s.remote != nil {
		if s.builds, err = buildjob.Open(ctx, buildjob.Config{
			State:   s.state,
			Server:  ccfg.Candidate,
			Node:    s.cluster.BuildNode,
			Limiter: api.TeamBuilds(s.keys),
			Logger:  log,
		}); err != nil {
			return nil, err
		}
		acfg.Builds = s.builds
	}
	acfg.VolumeContent = s.volumeContent
	// Pulls are build jobs too: a node unpacks the image and publishes
	// it, under its own bounds.
	acfg.Pulls = acfg.Builds != nil
	s.api = api.New(acfg)
	s.stopSweep = sweepBuildFiles(s.api, log)
	handler := s.withClusterAdmin(s.withJoin(s.withNode(s.api)))
	handler = withConsole(handler, s.keys, cfg.dataKeys, console.Config{Logger: log, LimitSignIn: s.api.LimitSignIn})
	s.http = &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		// Idle keep-alive connections are closed; streams are not idle
		// (envd sends keepalives on them).
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
	}
	tlsCfg, err := s.apiTLS(s.listener.Addr(), domain)
	if err != nil {
		return nil, err
	}
	useTLS := tlsCfg != nil
	if useTLS {
		s.http.TLSConfig = tlsCfg
		// HTTP/1.1 only, as in plain HTTP: the proxy hijacks connections
		// (upgrades, raw streams to sandbox ports), which HTTP/2 has not.
		s.http.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
	}
	if cfg.InsecureCluster {
		log.Warn(membership.InsecureClusterWarning)
	}
	go func() {
		var err error
		if useTLS {
			err = s.http.ServeTLS(s.listener, "", "")
		} else {
			err = s.http.Serve(s.listener)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving HTTP", "err", err)
		}
	}()
	if cfg.Trust.ClusterListen != "" {
		if err := s.startClusterListener(cfg.Trust.ClusterListen); err != nil {
			return nil, err
		}
	}
	if s.host != nil {
		// Registered once it serves: the other servers reach the node's
		// API and sandboxes at this address from then on.
		advertise, nodeTLS, err := s.localNodeAdvertise(useTLS)
		if err != nil {
			return nil, err
		}
		instance, err := membership.LoadInstance(cfg.DataDir)
		if err != nil {
			return nil, err
		}
		if s.registration, err = membership.RegisterNode(ctx, s.state, membership.TLSReporter(s.host.API(), advertise, instance, nodeTLS), log); err != nil {
			return nil, err
		}
		s.host.Node().OnPoolChange(s.registration.Nudge)
	}
	if info := s.serverInfo(ccfg.Candidate); len(info.Addresses) > 0 {
		if s.serverRegistration, err = membership.RegisterServer(ctx, s.state, info, log); err != nil {
			return nil, err
		}
	}
	log.Info("aenv server listening", "addr", s.listener.Addr().String(), "tls", useTLS, "domain", domain, "local_node", s.host != nil)
	return s, nil
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
	if errors.Is(err, cluster.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", proxy.ErrUnavailable, err)
	}
	return proxy.Route{Addr: r.Addr, Via: r.Via, TrafficToken: r.TrafficToken, MaskRequestHost: r.MaskRequestHost}, err
}

// storeOf is the cluster's store as this server opened it (nil: none).
func (s *Server) storeOf() *store.Repository {
	if s.host != nil {
		return s.host.Store()
	}
	return s.remote
}

// dial reaches a node agent with the cluster token.
func (s *Server) dial(id, address string) nodeapi.Node {
	n := nodeapi.Node(nodeapi.Dial(id, address, s.trust.roundTripper(id)))
	if s.cfg.wrapNode != nil {
		n = s.cfg.wrapNode(n)
	}
	return n
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
	// Before the HTTP server: the streams that follow builds end with
	// them.
	if s.builds != nil {
		errs = append(errs, s.builds.Close(ctx))
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
	if s.clusterHTTP != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := s.clusterHTTP.Shutdown(sctx); err != nil {
			s.clusterHTTP.Close()
		}
		cancel()
	} else if s.clusterListener != nil {
		s.clusterListener.Close()
	}
	if s.serverRegistration != nil {
		s.serverRegistration.Stop()
	}
	if s.registration != nil {
		s.registration.Stop()
		// A node that keeps its sandboxes for the next start stays
		// registered until its lease runs out; one that ends them goes.
		if s.cfg.OnStop != cluster.StopKeep {
			if err := membership.DeregisterNode(ctx, s.state, s.host.Node().ID()); err != nil {
				s.log.Warn("deregistering node", "err", err)
			}
		}
	}
	if s.cluster != nil {
		errs = append(errs, s.cluster.Close(ctx, s.cfg.OnStop))
	}
	if s.host != nil {
		errs = append(errs, s.host.Close(ctx, s.cfg.OnStop))
	}
	s.trust.close()
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
	s.etcdTLS.Close()
	return errors.Join(errs...)
}

// serverInfo is this server's record in the registry (name is its
// election candidate): where the others, and sandboxes that must not,
// reach it. Its API is there when it advertises one or listens on one
// host; a server listening on every address without --advertise says
// nothing of it (its local node, registered on its own, may).
func (s *Server) serverInfo(name string) membership.ServerInfo {
	info := membership.ServerInfo{Name: name}
	if a, err := agent.Advertised(s.cfg.Advertise, s.listener.Addr()); err == nil {
		info.Addresses = append(info.Addresses, a)
	}
	if s.clusterAdvertise != "" {
		info.Addresses = append(info.Addresses, s.clusterAdvertise)
	}
	for _, e := range s.state.Endpoints() {
		if !strings.HasPrefix(e, "unix:") {
			info.Addresses = append(info.Addresses, e)
		}
	}
	return info
}

func portOf(a net.Addr) string {
	_, port, _ := net.SplitHostPort(a.String())
	return port
}

// volumeContent is the data plane of the volumes of node nodeID: this
// host's files, or the node's own data plane (behind the cluster token).
func (s *Server) volumeContent(nodeID string) (http.Handler, error) {
	addr, ok := s.cluster.NodeAddress(nodeID)
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: node %s, which holds the volume, is not reachable", cluster.ErrUnavailable, nodeID)
	case addr == "" && s.host != nil:
		return s.host.Volumes().Content(), nil
	case addr == "":
		return nil, fmt.Errorf("%w: node %s runs inside another server", cluster.ErrUnavailable, nodeID)
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: addr})
			pr.Out.Header.Del("Authorization") // the volume's token stays here
		},
		Transport: s.trust.roundTripper(nodeID),
	}, nil
}
