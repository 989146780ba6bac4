package envd

import "net/http"

// handleHealth answers 204 without authentication: the SDK and the
// platform probe it to tell whether the sandbox is up.
func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}
