package blockimage

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The image server answers its node on a unix socket, in JSON over HTTP:
// the node is its only client, on the same host, so nothing more is
// needed (the socket is the node's, mode 0600).
//
//	GET  /v1/info      pid, version, the images mounted and the cache
//	POST /v1/acquire   {source, holder} → {dir}
//	POST /v1/release   {holder}
//	POST /v1/sync      {live: [holder]} → {released}
//	POST /v1/shutdown  unmount everything and exit
//	GET  /metrics      Prometheus text

// Info is what GET /v1/info answers.
type Info struct {
	PID     int           `json:"pid"`
	Version string        `json:"version"`
	Images  []ImageStatus `json:"images"`
	// Cache is the node's image cache as a whole (nil from an image
	// server of an aenv that did not report it).
	Cache *CacheStats `json:"cache,omitempty"`
}

type acquireRequest struct {
	Source Source `json:"source"`
	Holder string `json:"holder"`
}

type acquireResponse struct {
	Dir string `json:"dir"`
	// File is Mounted.File; an image server older than it leaves it out.
	File string `json:"file,omitempty"`
}

type releaseRequest struct {
	Holder string `json:"holder"`
}

type syncRequest struct {
	Live []string `json:"live"`
}

type syncResponse struct {
	Released int `json:"released"`
}

type errorResponse struct {
	Message string `json:"message"`
}

// Version is the image server's protocol: a node refuses a server that
// speaks another (a leftover of an older aenv still serving sandboxes).
const Version = "1"

// Serve answers on socket until ctx ends or a client asks for a
// shutdown, then unmounts every image (Close).
func (s *Server) Serve(ctx context.Context, socket string) error {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return fmt.Errorf("image server: %w", err)
	}
	os.Remove(socket) // a previous server's, gone (the node checked)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("image server: listening on %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("image server: %w", err)
	}
	shutdown := make(chan struct{}, 1)
	srv := &http.Server{Handler: s.handler(shutdown), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	s.log.Info("image server listening", "socket", socket, "pid", os.Getpid())
	gone := socketGone(ctx, socket)
	select {
	case <-ctx.Done():
	case <-shutdown:
	case <-gone:
		// Its run directory was removed (an uninstall, a test's
		// cleanup): no node can reach it any more.
		s.log.Warn("image server socket gone; stopping", "socket", socket)
	}
	// Unmounted first, answering meanwhile: a node waiting for the stop
	// (Client.Stop) sees the socket go only once the mounts are gone.
	s.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	s.log.Info("image server stopped")
	return nil
}

// socketGoneEvery is how often the image server checks its socket is
// still its own.
const socketGoneEvery = 5 * time.Second

// socketGone is closed once socket no longer names the socket the
// server listens on (removed, or replaced by another server's).
func socketGone(ctx context.Context, socket string) <-chan struct{} {
	gone := make(chan struct{})
	first, err := os.Stat(socket)
	if err != nil {
		close(gone)
		return gone
	}
	go func() {
		t := time.NewTicker(socketGoneEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if fi, err := os.Stat(socket); err != nil || !os.SameFile(first, fi) {
				close(gone)
				return
			}
		}
	}()
	return gone
}

func (s *Server) handler(shutdown chan<- struct{}) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		cache := s.CacheStats()
		writeJSON(w, http.StatusOK, Info{PID: os.Getpid(), Version: Version, Images: s.Images(), Cache: &cache})
	})
	mux.HandleFunc("POST /v1/acquire", func(w http.ResponseWriter, r *http.Request) {
		var req acquireRequest
		if !readJSON(w, r, &req) {
			return
		}
		if req.Holder == "" {
			writeJSON(w, http.StatusBadRequest, errorResponse{"acquiring an image: no holder"})
			return
		}
		m, err := s.AcquireImage(r.Context(), req.Source, req.Holder)
		if err != nil {
			writeJSON(w, http.StatusBadGateway, errorResponse{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, acquireResponse{Dir: m.Dir, File: m.File})
	})
	mux.HandleFunc("POST /v1/release", func(w http.ResponseWriter, r *http.Request) {
		var req releaseRequest
		if readJSON(w, r, &req) {
			s.Release(req.Holder)
			writeJSON(w, http.StatusOK, struct{}{})
		}
	})
	mux.HandleFunc("POST /v1/sync", func(w http.ResponseWriter, r *http.Request) {
		var req syncRequest
		if readJSON(w, r, &req) {
			writeJSON(w, http.StatusOK, syncResponse{Released: s.Sync(req.Live)})
		}
	})
	mux.HandleFunc("POST /v1/shutdown", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, struct{}{})
		select {
		case shutdown <- struct{}{}:
		default:
		}
	})
	return mux
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(v); err != nil {
		writeJSON(w, http.StatusBadRequest, errorResponse{"reading the request: " + err.Error()})
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
