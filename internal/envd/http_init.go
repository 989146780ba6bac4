package envd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
)

// handleInit lets the platform configure envd after start (and again
// after a resume): access token, sandbox-wide env vars, default user and
// working directory. Once a token is set, /init must present it too.
func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	allowed := s.initFrom
	if allowed == nil {
		allowed = fromOutside
	}
	if err != nil || !allowed(peer.Addr().Unmap()) {
		s.log.Warn("refused /init from inside the sandbox", "peer", r.RemoteAddr)
		writeHTTPError(w, fmt.Errorf("%w: /init is for the platform, not for callers inside the sandbox", errForbidden))
		return
	}
	var req initRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeHTTPError(w, fmt.Errorf("parsing init request: %w: %v", errInvalid, err))
		return
	}
	if s.cfg.apply(req) {
		s.log.Info("initialized", "env_vars", len(req.EnvVars), "token_set", req.AccessToken != nil && *req.AccessToken != "")
		s.shells.reconfigured()
	} else {
		s.log.Info("ignored stale init request", "timestamp", req.Timestamp)
	}
	w.WriteHeader(http.StatusNoContent)
}

// fromOutside reports whether peer is outside the sandbox: not loopback
// and not an address of any of the sandbox's own interfaces. The node
// reaches envd from the host, through the slot's router, so its address
// is never the sandbox's own; a process inside can only connect from its
// own addresses, and only root could add one (root already controls its
// sandbox, and nothing beyond it).
func fromOutside(peer netip.Addr) bool {
	if !peer.IsValid() || peer.IsLoopback() || peer.IsUnspecified() {
		return false
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == peer {
				return false
			}
		}
	}
	return true
}
