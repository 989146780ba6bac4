// Command envd is the agent inside every sandbox: it serves E2B's envd
// protocol (processes, files, watches) on port 49983. It runs as PID 1 of
// the sandbox and must build as a static binary (CGO_ENABLED=0).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/aenvhq/aenv/internal/envd"
	"github.com/aenvhq/aenv/internal/runtime"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("envd", flag.ContinueOnError)
	port := fs.Int("port", envd.DefaultPort, "port to serve on")
	token := fs.String("access-token", "", "access token required on every request but /health (default $"+envd.AccessTokenEnv+")")
	defaultUser := fs.String("default-user", "user", "user that runs requests naming none")
	verbose := fs.Bool("verbose", false, "log debug messages")
	version := fs.Bool("version", false, "print the envd version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *version {
		fmt.Println(envd.Version)
		return nil
	}
	if *token == "" {
		*token = os.Getenv(envd.AccessTokenEnv)
	}
	// Children inherit envd's environment; the token must not be in it.
	if err := os.Unsetenv(envd.AccessTokenEnv); err != nil {
		return fmt.Errorf("clearing %s: %w", envd.AccessTokenEnv, err)
	}
	hostsFile, err := envd.WriteEtcFiles("/")
	if err != nil {
		return err
	}

	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	pid1 := os.Getpid() == 1
	srv, err := envd.New(envd.Options{
		Logger:      log,
		AccessToken: *token,
		DefaultUser: *defaultUser,
		BaseEnv:     os.Environ(),
		ReapAll:     pid1,
		ReadyShell:  true,
		HostsFile:   hostsFile,
	})
	if err != nil {
		return fmt.Errorf("starting envd: %w", err)
	}
	defer srv.Close()

	// No TCP keep-alive: its four setsockopt calls per connection cost
	// ~40 µs of host CPU each under gVisor, on every sandbox's first
	// command. The only peer is the node's proxy, streams carry envd's own
	// keep-alive events, and IdleTimeout closes idle connections.
	lc := net.ListenConfig{KeepAlive: -1}
	ln, err := lc.Listen(context.Background(), "tcp", ":"+strconv.Itoa(*port))
	if err != nil {
		return fmt.Errorf("listening on port %d: %w", *port, err)
	}
	hs := envd.NewHTTPServer(ln.Addr().String(), srv.Handler())
	hs.ReadHeaderTimeout = 30 * time.Second
	hs.IdleTimeout = 5 * time.Minute

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	// The driver reads this line from envd's log (runtime.EnvdWatcher).
	log.Info(runtime.EnvdServingMessage, "addr", ln.Addr().String(), "version", envd.Version, "pid1", pid1, "access_token", *token != "")

	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutting down: %w", err)
	}
	return nil
}
