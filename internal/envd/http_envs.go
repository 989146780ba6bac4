package envd

import "net/http"

// handleGetEnvs returns the sandbox-wide environment variables set by
// /init as a JSON object.
func (s *Server) handleGetEnvs(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.cfg.env())
}
