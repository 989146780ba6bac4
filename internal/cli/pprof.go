package cli

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
)

// servePprof serves Go's profiles (heap, goroutines, CPU) at addr, for
// finding what a long run keeps: the soak bench's heap growth is read
// from /metrics, but what grows only shows in a heap profile. Loopback
// only: a profile shows the process's memory, secrets included.
func servePprof(addr string, log *slog.Logger) error {
	if addr == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--pprof-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("--pprof-listen %q: must be a loopback address (e.g. 127.0.0.1:6060)", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--pprof-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	go func() {
		err := http.Serve(l, mux)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			log.Warn("serving pprof", "err", err)
		}
	}()
	log.Info("serving Go profiles", "addr", l.Addr().String())
	return nil
}
