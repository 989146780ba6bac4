package server

import (
	"log/slog"
	"net"
	"net/http"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
)

// withNode serves, in front of h, what other servers ask of this server's
// local node: their requests carry the cluster token (clients never do),
// and go to the node's handler as a node agent's would, which checks the
// token. Without a local node h serves everything.
func (s *Server) withNode(h http.Handler) http.Handler {
	if s.host == nil {
		return h
	}
	node := s.host.NodeHandler(s.token, s.log)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := r.Header[http.CanonicalHeaderKey(nodeapi.TokenHeader)]; ok {
			node.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// localNodeAddress is the address the local node is registered at, where
// the other servers of the cluster reach its API and its sandboxes: the
// --advertise flag, else the listening address when it names a host. A
// server listening on every address (the default :8000) without
// --advertise, or serving TLS (the servers dial nodes in plain HTTP),
// registers none, and says that only it can then reach its sandboxes.
// A malformed flag is an error.
func localNodeAddress(flag string, listen net.Addr, tls, insecure bool, log *slog.Logger) (string, error) {
	if tls {
		log.Warn("the local node is not advertised: other servers reach nodes over plain HTTP, and this one serves TLS; only this server reaches its sandboxes")
		return "", nil
	}
	addr, err := agent.Advertised(flag, listen)
	switch {
	case err != nil && flag != "":
		return "", err
	case err != nil:
		log.Info("the local node is not advertised (the server listens on every address): give --advertise HOST:PORT for other servers of a cluster to reach its sandboxes", "listen", listen.String())
	case addr != "":
		if err := membership.CheckPlain("the local node, advertised", addr, "keep the cluster listener (--cluster-listen), which serves it over mutual TLS", insecure); err != nil {
			log.Warn("the local node is not advertised: only this server reaches its sandboxes", "err", err)
			return "", nil
		}
	}
	return addr, nil
}

// localNodeAdvertise is where the local node is registered, and whether
// it is reached there over mutual TLS: the cluster listener's advertised
// address when there is one, else localNodeAddress's (plain HTTP with
// the cluster token, on the API's port).
func (s *Server) localNodeAdvertise(apiTLS bool) (string, bool, error) {
	if s.clusterAdvertise != "" {
		return s.clusterAdvertise, true, nil
	}
	addr, err := localNodeAddress(s.cfg.Advertise, s.listener.Addr(), apiTLS, s.cfg.InsecureCluster, s.log)
	return addr, false, err
}
