// Command interpreter is the code-interpreter service of the
// code-interpreter template: it serves the API of @e2b/code-interpreter on
// port 49999 over Jupyter kernels (see internal/interpreter). Sandboxes get
// it from their node at /.aenv/interpreter, like envd; it must build as a
// static binary (CGO_ENABLED=0).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/aenvhq/aenv/internal/interpreter"
)

// Port is where the SDK looks for the service.
const Port = 49999

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "interpreter:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("interpreter", flag.ContinueOnError)
	port := fs.Int("port", Port, "port to serve on")
	python := fs.String("python", interpreter.DefaultPython, "Python interpreter with IPython")
	home, _ := os.UserHomeDir()
	cwd := fs.String("cwd", home, "working directory of new contexts")
	verbose := fs.Bool("verbose", false, "log debug messages (kernels' own output too)")
	envdURL := fs.String("envd", "http://127.0.0.1:49983", "the sandbox's envd, whose environment (the create's envs) every execution gets and whose access token every request must carry; empty: none, and no token")
	prestart := fs.Bool("prestart", true, "start the default Python kernel before the port opens (false: at the first Python execution, for trees without IPython)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	srv := interpreter.New(interpreter.Config{Python: *python, Cwd: *cwd, Logger: log, EnvdURL: *envdURL})
	defer srv.Close()
	// The default kernel is up before the port opens: a ready check on
	// the port then means the first execution runs at once.
	if *prestart {
		startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := srv.Start(startCtx)
		cancel()
		if err != nil {
			return err
		}
	}
	hs := &http.Server{Addr: ":" + strconv.Itoa(*port), Handler: srv.Handler(), ReadHeaderTimeout: 30 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.ListenAndServe() }()
	log.Info("code interpreter ready", "port", *port)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
