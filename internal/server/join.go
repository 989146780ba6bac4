package server

import (
	"encoding/json"
	"net/http"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/proxy"
)

// withJoin answers membership.JoinPath, for node agents holding the cluster token,
// in front of h.
func (s *Server) withJoin(h http.Handler) http.Handler {
	join := nodeapi.RequireToken(s.token, s.log, http.HandlerFunc(s.join))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == membership.JoinPath {
			if _, _, sandbox := proxy.Match(r); !sandbox {
				join.ServeHTTP(w, r)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// dataKeyText is the data keys a joining node is handed.
func (s *Server) dataKeyText() string { return s.cfg.dataKeys.Text() }

func (s *Server) join(w http.ResponseWriter, r *http.Request) {
	if s.etcdTLS != nil {
		// Such a node would have no certificate to reach etcd with.
		writeJSONError(w, http.StatusConflict, "this cluster's etcd serves TLS with client certificates of the cluster's CA: join over TLS with a join token (aenv cluster join-command)")
		return
	}
	eps, err := s.nodeEtcdEndpoints()
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(map[string]any{"code": http.StatusConflict, "message": err.Error()})
		return
	}
	s.log.Info("a node is joining", "remote", r.RemoteAddr)
	_ = json.NewEncoder(w).Encode(membership.JoinAnswer{EtcdEndpoints: eps, DataKey: s.dataKeyText()})
}
