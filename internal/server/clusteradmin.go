package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/proxy"
	"github.com/aenvhq/aenv/internal/state"
)

// JoinCommand is the answer to POST /cluster/join-tokens: a new join
// token and the command that joins a node (or, of the server role, an
// API server) with it.
type JoinCommand struct {
	Token     string              `json:"token"`
	ID        string              `json:"id"`
	Role      membership.JoinRole `json:"role"`
	ExpiresAt time.Time           `json:"expiresAt"`
	CAHash    string              `json:"caHash"`
	// URL is the cluster listener nodes join at.
	URL     string `json:"url"`
	Command string `json:"command"`
}

// withClusterAdmin serves, in front of h, the admin routes of the
// cluster's membership: join tokens (`aenv cluster join-command`,
// `aenv cluster tokens`), node removal (`aenv node rm`) and the etcd
// cluster's members (`aenv cluster etcd`).
func (s *Server) withClusterAdmin(h http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /cluster/join-tokens", s.api.AdminOnly(http.HandlerFunc(s.createJoinToken)))
	mux.Handle("GET /cluster/join-tokens", s.api.AdminOnly(http.HandlerFunc(s.listJoinTokens)))
	mux.Handle("DELETE /cluster/join-tokens/{id}", s.api.AdminOnly(http.HandlerFunc(s.revokeJoinToken)))
	mux.Handle("DELETE /nodes/{nodeID}", s.api.AdminOnly(http.HandlerFunc(s.removeNode)))
	mux.Handle("GET /cluster/etcd", s.api.AdminOnly(http.HandlerFunc(s.listEtcdMembers)))
	mux.Handle("GET /cluster/servers", s.api.AdminOnly(http.HandlerFunc(s.listServers)))
	mux.Handle("DELETE /cluster/etcd/{member}", s.api.AdminOnly(http.HandlerFunc(s.removeEtcdMember)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, sandbox := proxy.Match(r); !sandbox {
			if _, pattern := mux.Handler(r); pattern != "" {
				mux.ServeHTTP(w, r)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) createJoinToken(w http.ResponseWriter, r *http.Request) {
	var req struct {
		TTLSeconds  int    `json:"ttlSeconds"`
		Description string `json:"description"`
		// Role is what the token joins: "node" (the default) or
		// "server".
		Role membership.JoinRole `json:"role"`
	}
	if r.ContentLength != 0 {
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10)).Decode(&req); err != nil {
			writeJSONError(w, http.StatusBadRequest, "reading the request: "+err.Error())
			return
		}
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > 7*24*3600 {
		writeJSONError(w, http.StatusBadRequest, "ttlSeconds must be between 1 s and 7 days (0: 1 hour)")
		return
	}
	if req.Role == "" {
		req.Role = membership.JoinNode
	}
	if req.Role != membership.JoinNode && req.Role != membership.JoinServer {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("role must be %q or %q, not %q", membership.JoinNode, membership.JoinServer, req.Role))
		return
	}
	if s.clusterListener == nil {
		writeJSONError(w, http.StatusConflict, "this server has no cluster listener (start it with --cluster-listen): nodes join over TLS there")
		return
	}
	addr := s.clusterAdvertise
	if addr == "" {
		// Listening on every address: the host the admin reached this
		// server at, on the cluster port.
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		addr = net.JoinHostPort(host, portOf(s.clusterListener.Addr()))
	}
	tok, rec, err := membership.CreateJoinToken(r.Context(), s.state, membership.JoinTokenSpec{
		TTL: time.Duration(req.TTLSeconds) * time.Second, Description: req.Description, Role: req.Role}, time.Now())
	if err != nil {
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	url := "https://" + addr
	out := JoinCommand{Token: tok, ID: rec.ID, Role: rec.Role, ExpiresAt: rec.ExpiresAt, CAHash: s.trust.ca.Hash(), URL: url,
		Command: fmt.Sprintf("aenv %s --join %s --token %s --ca-hash %s", rec.Role, url, tok, s.trust.ca.Hash())}
	s.log.Info("created a join token", "token_id", rec.ID, "role", rec.Role, "expires", rec.ExpiresAt)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(out)
}

func (s *Server) listJoinTokens(w http.ResponseWriter, r *http.Request) {
	recs, err := membership.ListJoinTokens(r.Context(), s.state, time.Now())
	if err != nil {
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	type listed struct {
		ID          string              `json:"id"`
		Role        membership.JoinRole `json:"role"`
		Description string              `json:"description,omitempty"`
		CreatedAt   time.Time           `json:"createdAt"`
		ExpiresAt   time.Time           `json:"expiresAt"`
	}
	out := []listed{}
	for _, r := range recs {
		role := r.Role
		if role == "" {
			role = membership.JoinNode
		}
		out = append(out, listed{ID: r.ID, Role: role, Description: r.Description, CreatedAt: r.CreatedAt, ExpiresAt: r.ExpiresAt})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func (s *Server) revokeJoinToken(w http.ResponseWriter, r *http.Request) {
	err := membership.RevokeJoinToken(r.Context(), s.state, r.PathValue("id"))
	switch {
	case errors.Is(err, state.ErrNotFound):
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("join token %s not found (expired or revoked)", r.PathValue("id")))
	case err != nil:
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
	default:
		s.log.Info("revoked a join token", "token_id", r.PathValue("id"))
		w.WriteHeader(http.StatusNoContent)
	}
}

// removeNode marks a node removed: its certificate is refused by every
// server from then on, and not renewed; its etcd user is deleted.
func (s *Server) removeNode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("nodeID")
	if !nodeIDPattern.MatchString(id) {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("invalid node id %q", id))
		return
	}
	if err := membership.RemoveNode(r.Context(), s.state, id, time.Now()); err != nil {
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	if s.etcdTLS != nil {
		// Its certificate, good until it expires, reaches nothing in
		// etcd from now on.
		if err := membership.RevokeNode(r.Context(), s.state, id); err != nil {
			writeJSONError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	s.log.Info("removed a node from the cluster", "node_id", id)
	w.WriteHeader(http.StatusNoContent)
}

// listEtcdMembers answers the etcd cluster's members, with its leader.
func (s *Server) listEtcdMembers(w http.ResponseWriter, r *http.Request) {
	ms, err := s.state.Members(r.Context())
	if err != nil {
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(ms)
}

// removeEtcdMember removes a member (by name or hex id) of the etcd
// cluster: a server gone for good, which would otherwise count against
// the quorum. Its server can no longer start on its data.
func (s *Server) removeEtcdMember(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("member")
	err := s.state.RemoveMember(r.Context(), name)
	switch {
	case errors.Is(err, state.ErrNotFound):
		writeJSONError(w, http.StatusNotFound, fmt.Sprintf("etcd member %s not found", name))
	case errors.Is(err, state.ErrLastMember):
		writeJSONError(w, http.StatusConflict, err.Error())
	case err != nil:
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
	default:
		s.log.Warn("removed a member of the cluster's etcd", "member", name)
		w.WriteHeader(http.StatusNoContent)
	}
}

// listServers answers the API servers running now (the registry the
// nodes keep their sandboxes off).
func (s *Server) listServers(w http.ResponseWriter, r *http.Request) {
	servers, err := membership.ListServers(r.Context(), s.state)
	if err != nil {
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(servers)
}
