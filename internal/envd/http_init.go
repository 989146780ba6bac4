package envd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// handleInit lets the platform configure envd after start (and again
// after a resume): access token, sandbox-wide env vars, default user and
// working directory. Once a token is set, /init must present it too.
func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	var req initRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeHTTPError(w, fmt.Errorf("parsing init request: %w: %v", errInvalid, err))
		return
	}
	if s.cfg.apply(req) {
		s.log.Info("initialized", "env_vars", len(req.EnvVars), "token_set", req.AccessToken != nil && *req.AccessToken != "")
	} else {
		s.log.Info("ignored stale init request", "timestamp", req.Timestamp)
	}
	w.WriteHeader(http.StatusNoContent)
}
