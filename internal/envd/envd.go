// Package envd is the agent that runs inside every sandbox (as PID 1 under
// gVisor). It serves E2B's envd protocol on one port: the Connect services
// process.Process and filesystem.Filesystem (JSON codec, HTTP/1.1 or h2c)
// plus the plain HTTP endpoints /health, /files, /envs, /init and /metrics,
// so that the unmodified E2B SDKs can drive a sandbox.
//
// envd is stand-alone: it imports nothing else from this module except its
// generated protocol code in envd/spec. Only cmd/envd and tests import it.
package envd

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem/filesystemconnect"
	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
)

// Version is the E2B envd version this implementation is compatible with.
// The SDK gates features on it (0.3.0 stdin control, 0.4.0 default user,
// 0.5.2 CloseStdin, 0.5.7 octet-stream upload, 0.6.2 file metadata, 0.6.3
// entries in watch events, 0.6.4 watching network mounts on request), so it
// must never claim more than is implemented here.
const Version = "0.6.4"

// DefaultPort is the port E2B clients expect envd on.
const DefaultPort = 49983

// AccessTokenEnv is the environment variable that may carry the access
// token. envd never passes it on to the processes it starts.
const AccessTokenEnv = "AENV_ENVD_ACCESS_TOKEN"

// Options configures a Server.
type Options struct {
	// Logger receives envd's logs; nil discards them.
	Logger *slog.Logger
	// AccessToken, when non-empty, must accompany every request but /health.
	AccessToken string
	// DefaultUser runs requests that name no user ("user" if empty). When it
	// does not exist in the passwd file, root is used instead.
	DefaultUser string
	// EtcDir holds the passwd and group files users are looked up in
	// ("/etc" if empty). Tests point it at a fake.
	EtcDir string
	// BaseEnv is the environment every process starts from, before the
	// user's variables, the /init variables and the request's own. It must
	// not contain the access token.
	BaseEnv []string
	// ReapAll makes envd wait for every child, including orphans re-parented
	// to it. Set it when envd is PID 1 (or a child subreaper); otherwise envd
	// waits only for the processes it started, so that the rest of the
	// program keeps its children.
	ReapAll bool
	// InitFrom decides which peers may call /init, which sets the access
	// token, the default user and the environment. nil admits only peers
	// outside the sandbox (see fromOutside): the node that started it,
	// never a process inside it, which would otherwise make itself root.
	InitFrom func(peer netip.Addr) bool
	// ReadyShell keeps a login shell started ahead of time for the next
	// `/bin/bash -l -c` command (see readyShells). It starts processes of
	// its own, so only the sandbox's envd turns it on.
	ReadyShell bool
	// ReadyShellIdle is how long at least the ready shell outlives the
	// last login-shell command's start or end (0: 20 s); longer when the
	// commands' recent pauses were (see readyKeep).
	ReadyShellIdle time.Duration
	// HostsFile is a hosts file envd wrote at start (WriteEtcFiles), whose
	// line for the host's own name it keeps current (see hostsFollower).
	HostsFile string
	// ReadyShellLone is how long after a lone login-shell command's end
	// the next ready shell starts (0: 1 s); see readyShells.ended.
	ReadyShellLone time.Duration
}

// Server is an envd instance. Create it with New, serve Handler, and Close
// it when done.
type Server struct {
	// initFrom admits /init's callers (Options.InitFrom).
	initFrom func(netip.Addr) bool
	log      *slog.Logger
	users    *userDBCache // Options.EtcDir's passwd and group
	baseEnv  []string

	cfg      *runtimeConfig
	reaper   *reaper
	procs    *procTable
	watchers *watcherTable
	cpu      *cpuSampler
	shells   *readyShells   // nil unless Options.ReadyShell
	hosts    *hostsFollower // nil without Options.HostsFile

	warnedUser atomic.Bool // the missing default user was logged

	handler   http.Handler
	closeOnce sync.Once
	cancel    context.CancelFunc
}

// New builds a Server and starts its child reaper.
func New(opts Options) (*Server, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	etc := opts.EtcDir
	if etc == "" {
		etc = "/etc"
	}
	defUser := opts.DefaultUser
	if defUser == "" {
		defUser = "user"
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		log:      log,
		users:    &userDBCache{etc: etc},
		baseEnv:  opts.BaseEnv,
		cfg:      newRuntimeConfig(opts.AccessToken, defUser),
		initFrom: opts.InitFrom,
		procs:    newProcTable(),
		watchers: newWatcherTable(),
		cpu:      &cpuSampler{},
		hosts:    newHostsFollower(opts.HostsFile),
		cancel:   cancel,
	}
	r, err := startReaper(ctx, opts.ReapAll, log)
	if err != nil {
		cancel()
		return nil, errors.Join(errors.New("starting child reaper"), err)
	}
	s.reaper = r
	s.handler = s.routes()
	if opts.ReadyShell {
		s.shells = &readyShells{
			s:         s,
			idleAfter: cmp.Or(opts.ReadyShellIdle, readyShellIdle),
			loneAfter: cmp.Or(opts.ReadyShellLone, readyShellLone),
		}
		s.shells.refill()
	}
	return s, nil
}

// Handler serves the whole envd API.
func (s *Server) Handler() http.Handler { return s.handler }

// Close stops the reaper and all watchers. Processes keep running: envd
// only closes when the sandbox goes away.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.watchers.closeAll()
		s.shells.close()
	})
	return nil
}

// NewHTTPServer returns an http.Server for h on addr that speaks HTTP/1.1
// and unencrypted HTTP/2 (h2c), as E2B clients may use either.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	srv := &http.Server{Addr: addr, Handler: h}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	return srv
}

// compressMinBytes is the smallest response message envd compresses.
const compressMinBytes = 64 << 10

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	// Connect compresses every response message a client accepts gzip
	// for, and each gzip writer is a 1.3 MiB flate compressor that the
	// pool then keeps: after one command, envd's live heap was 2.0 MiB,
	// 1.6 MiB of it the compressor (heap profile), in every idle sandbox.
	// Process output is read 32 KiB at a time, so its messages are never
	// compressed; only large ones (directory listings) are.
	opts := []connect.HandlerOption{connect.WithCompressMinBytes(compressMinBytes)}
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...))
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("GET /files", s.handleGetFiles)
	mux.HandleFunc("POST /files", s.handlePostFiles)
	mux.HandleFunc("GET /envs", s.handleGetEnvs)
	mux.HandleFunc("POST /init", s.handleInit)
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	return s.withCORS(s.withAuth(mux))
}
