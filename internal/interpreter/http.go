package interpreter

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"
)

// MaxCodeBytes bounds one execution's request.
const MaxCodeBytes = 16 << 20

// Handler returns the service's HTTP API.
func (s *Server) Handler() http.Handler {
	m := http.NewServeMux()
	m.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	m.HandleFunc("POST /execute", s.handleExecute)
	m.HandleFunc("POST /contexts", s.handleCreate)
	m.HandleFunc("GET /contexts", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, s.list()) })
	m.HandleFunc("DELETE /contexts/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !s.remove(r.PathValue("id")) {
			writeError(w, http.StatusNotFound, "context "+r.PathValue("id")+" not found")
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("POST /contexts/{id}/restart", func(w http.ResponseWriter, r *http.Request) {
		c := s.get(r.PathValue("id"))
		if c == nil {
			writeError(w, http.StatusNotFound, "context "+r.PathValue("id")+" not found")
			return
		}
		if err := s.restart(r.Context(), c); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	return s.withAuth(m)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	r.Body = http.MaxBytesReader(w, r.Body, MaxCodeBytes)
	if err := json.NewDecoder(r.Body).Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return false
	}
	return true
}

func (s *Server) handleCreate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if !decode(w, r, &body) {
		return
	}
	c, err := s.create(r.Context(), body.Language, body.Cwd)
	switch {
	case errors.Is(err, ErrUnsupportedLanguage), errors.Is(err, errBadCwd):
		writeError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, c)
	}
}

func (s *Server) handleExecute(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Code      string            `json:"code"`
		ContextID string            `json:"context_id"`
		Language  string            `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if !decode(w, r, &body) {
		return
	}
	var c *codeContext
	if body.ContextID != "" {
		if c = s.get(body.ContextID); c == nil {
			writeError(w, http.StatusNotFound, "context "+body.ContextID+" not found")
			return
		}
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	// The SDK's execution timeout runs from the response's headers on:
	// send them now, not with the first output.
	if flusher != nil {
		flusher.Flush()
	}
	enc := json.NewEncoder(w)
	emit := func(ev event) {
		enc.Encode(ev)
		if flusher != nil {
			flusher.Flush()
		}
	}
	if c == nil {
		var err error
		c, err = s.defaultContext(r.Context(), body.Language)
		if errors.Is(err, ErrUnsupportedLanguage) {
			// As an execution error, so that the SDK's Execution.error
			// names it (an HTTP error would reach the caller as a bare
			// status line).
			emit(event{"type": "error", "name": "UnsupportedLanguage", "value": err.Error(), "traceback": ""})
			emit(event{"type": "end_of_execution"})
			return
		}
		if err != nil {
			emit(event{"type": "error", "name": "KernelError", "value": err.Error(), "traceback": ""})
			emit(event{"type": "end_of_execution"})
			return
		}
	}
	globals := s.sandboxEnv(r.Context(), r.Header.Get(AccessTokenHeader))
	start := time.Now()
	err := s.execute(r.Context(), c, body.Code, globals, body.EnvVars, emit)
	if err != nil {
		if r.Context().Err() != nil {
			s.log.Info("execution interrupted: the client went away or timed out", "context_id", c.ID,
				"after_ms", time.Since(start).Milliseconds())
			return
		}
		emit(event{"type": "error", "name": "KernelError", "value": err.Error(), "traceback": ""})
	}
	emit(event{"type": "end_of_execution"})
}

// sandboxEnv is the environment the sandbox was created with, from envd,
// with the access token the SDK sends along (envd demands it; processes
// in the sandbox cannot read it otherwise). Unreadable, it is empty: the
// execution still runs.
//
// Read once: envd gets a sandbox's environment at its handout, before any
// execution, and keeps it (the service's memory, restored with a fork's
// or a resume's, holds the same).
func (s *Server) sandboxEnv(ctx context.Context, token string) map[string]string {
	s.mu.Lock()
	cached := s.env
	s.mu.Unlock()
	if cached != nil {
		return cached
	}
	env := map[string]string{}
	if s.cfg.EnvdURL == "" {
		return env
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.EnvdURL+"/envs", nil)
	if err != nil {
		return env
	}
	if token != "" {
		req.Header.Set(AccessTokenHeader, token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		s.log.Debug("reading the sandbox's environment from envd", "err", err)
		return env
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&env) != nil {
		s.log.Debug("reading the sandbox's environment from envd", "status", res.Status)
		return map[string]string{}
	}
	s.mu.Lock()
	s.env = env
	s.mu.Unlock()
	return env
}
