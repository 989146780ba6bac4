package envd

import "net/http"

// handleHealth answers 204 without authentication: the SDK and the
// platform probe it to tell whether the sandbox is up. The platform's
// probe after a restore is when a changed host name is noticed.
func (s *Server) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if err := s.hosts.sync(); err != nil {
		s.log.Warn("updating the hosts file to the host name", "err", err)
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}
