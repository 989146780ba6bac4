package server

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/proxy"
)

// DefaultClusterListen is the cluster listener's address unless told
// otherwise (`aenv server --cluster-listen`).
const DefaultClusterListen = ":8443"

// nodeIDPattern is what a node may call itself when it joins: a host
// name's characters, as ids end up in etcd keys, certificate names and
// log lines.
var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// startClusterListener serves the cluster listener (Config.Trust) over
// TLS with the server's certificate: joins, renewals, and the local
// node for the other servers.
func (s *Server) startClusterListener(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil && s.cfg.Trust.ClusterListenDefaulted {
		s.log.Warn("no cluster listener: its default address is taken; nodes can join this server only the old, insecure way (give --cluster-listen)", "addr", addr, "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("listening on %s (the cluster listener): %w", addr, err)
	}
	s.clusterListener = l
	// A client certificate is asked for, not required: a joining node has
	// none yet. Those presented are verified against the CA; handlers
	// check the role their route needs.
	tcfg := pki.ServerConfig(s.trust.kp, s.trust.verifier, false, nil)
	var node http.Handler = http.NotFoundHandler()
	if s.host != nil {
		node = s.host.TLSNodeHandler(s.log)
	}
	s.clusterHTTP = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, _, sandbox := proxy.Match(r); !sandbox && r.Method == http.MethodPost {
				switch r.URL.Path {
				case membership.TLSJoinPath:
					s.tlsJoin(w, r)
					return
				case membership.RenewPath:
					s.renew(w, r)
					return
				case membership.ServerJoinPath:
					s.serverJoin(w, r)
					return
				}
			}
			node.ServeHTTP(w, r)
		}),
		TLSConfig: tcfg,
		// Refused handshakes (a wrong CA, no certificate) are the
		// callers' failures, told to them; here they are debug lines.
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	go func() {
		if err := s.clusterHTTP.Serve(tls.NewListener(l, tcfg)); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serving the cluster listener", "err", err)
		}
	}()
	s.clusterAdvertise = s.cfg.Trust.ClusterAdvertise
	if s.clusterAdvertise == "" {
		s.clusterAdvertise, _ = agent.Advertised("", l.Addr())
	}
	if s.clusterAdvertise == "" && s.cfg.Advertise != "" {
		// The host others reach this server at, on the cluster port.
		if h, _, err := net.SplitHostPort(s.cfg.Advertise); err == nil {
			s.clusterAdvertise = net.JoinHostPort(h, portOf(l.Addr()))
		}
	}
	return nil
}

// ClusterAddr is the address the cluster listener listens on (nil: none).
func (s *Server) ClusterAddr() net.Addr {
	if s.clusterListener == nil {
		return nil
	}
	return s.clusterListener.Addr()
}

// tlsJoin trades a join token and a certificate request for a node
// certificate and the join answer.
func (s *Server) tlsJoin(w http.ResponseWriter, r *http.Request) {
	s.trust.joins.Add(1)
	var req membership.JoinRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "reading the join request: "+err.Error())
		return
	}
	if !nodeIDPattern.MatchString(req.NodeID) {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("invalid node id %q: ids match %s", req.NodeID, nodeIDPattern))
		return
	}
	rec, err := membership.CheckJoinToken(r.Context(), s.state, req.Token, membership.JoinNode, time.Now())
	if errors.Is(err, membership.ErrJoinTokenRole) {
		s.log.Warn("refused a node's join with a server's join token", "node_id", req.NodeID, "remote", r.RemoteAddr, "err", err)
		writeJSONError(w, http.StatusForbidden, "this join token joins an API server (aenv server --join), not a node: make a node's with 'aenv cluster join-command'")
		return
	}
	if errors.Is(err, membership.ErrInvalidJoinToken) {
		s.log.Warn("refused a join", "node_id", req.NodeID, "remote", r.RemoteAddr, "err", err)
		writeJSONError(w, http.StatusUnauthorized, "invalid, expired or revoked join token")
		return
	}
	if err != nil {
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	// The certificate names the id the node registers under, and with
	// etcd's RBAC the only registration it may write: a join may not
	// take the id of a live node of another instance.
	if err := membership.CheckJoinID(r.Context(), s.state, req.NodeID, req.Instance); errors.Is(err, membership.ErrNodeIDTaken) {
		s.log.Warn("refused a join for a node id held by another live node", "node_id", req.NodeID, "remote", r.RemoteAddr, "err", err)
		writeJSONError(w, http.StatusConflict, err.Error())
		return
	} else if err != nil {
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	s.log.Info("a node is joining with a join token", "node_id", req.NodeID, "token_id", rec.ID, "remote", r.RemoteAddr)
	s.answerJoin(w, r, req.NodeID, req.CSR)
}

// renew trades a node's current certificate (presented in the handshake)
// for a new one, unless the node was removed.
func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		writeJSONError(w, http.StatusUnauthorized, "a renewal needs the node's current certificate")
		return
	}
	leaf := r.TLS.PeerCertificates[0]
	id := pki.IdentityOf(leaf)
	if id.Role != pki.RoleNode || !id.Serves(id.Name) {
		writeJSONError(w, http.StatusForbidden, "only a node's certificate is renewed here")
		return
	}
	if s.trust.removals.Refused(id.Name, pki.IssuedAt(leaf)) {
		s.log.Warn("refused the renewal of a removed node's certificate", "node_id", id.Name, "remote", r.RemoteAddr)
		writeJSONError(w, http.StatusForbidden, fmt.Sprintf("node %s was removed from the cluster; join it again with a new join token", id.Name))
		return
	}
	var req membership.JoinRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "reading the renewal: "+err.Error())
		return
	}
	s.answerJoin(w, r, id.Name, req.CSR)
}

// answerJoin issues node id a certificate for csr and answers with it,
// the CA, and what the old join answers. With RBAC on etcd, the
// certificate's name is an etcd user, made (or its role set again) first.
func (s *Server) answerJoin(w http.ResponseWriter, r *http.Request, id, csr string) {
	eps, err := s.nodeEtcdEndpoints()
	if err != nil {
		writeJSONError(w, http.StatusConflict, err.Error())
		return
	}
	if s.etcdTLS != nil {
		if err := membership.GrantNode(r.Context(), s.state, id); err != nil {
			s.log.Error("granting a joining node its etcd user", "node_id", id, "err", err)
			writeJSONError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	certPEM, err := s.trust.ca.IssueCSR([]byte(csr), pki.Request{
		Identity: pki.Identity{Role: pki.RoleNode, Name: id, Nodes: []string{id}},
		Lifetime: s.trust.lifetime,
	}, time.Now())
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(membership.JoinAnswer{EtcdEndpoints: eps, DataKey: s.dataKeyText(),
		Certificate: string(certPEM), CA: string(s.trust.ca.CertPEM())})
}

// nodeEtcdEndpoints are the etcd endpoints a node can reach: a member
// listening on every address is reached at the cluster listener's
// advertised host.
func (s *Server) nodeEtcdEndpoints() ([]string, error) {
	var eps []string
	advertised, _, _ := net.SplitHostPort(s.clusterAdvertise)
	for _, e := range s.state.Endpoints() {
		if strings.HasPrefix(e, "unix:") {
			continue
		}
		if u, err := url.Parse(e); err == nil && advertised != "" {
			if ip := net.ParseIP(u.Hostname()); ip != nil && ip.IsUnspecified() {
				u.Host = net.JoinHostPort(advertised, u.Port())
				e = u.String()
			}
		}
		eps = append(eps, e)
	}
	if len(eps) == 0 {
		return nil, errors.New("this server's etcd listens only on its unix socket; start the server with --etcd-listen URL or --etcd-endpoints so that nodes can reach it")
	}
	return eps, nil
}

func writeJSONError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "message": msg})
}
