package api

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/aenvhq/aenv/internal/proxy"
)

// rateLimiter bounds requests per client (API key or address) or per
// sandbox, so that one runaway client or sandbox cannot starve the others.
// Idle buckets are dropped.
type rateLimiter struct {
	perSecond rate.Limit
	burst     int

	mu      sync.Mutex
	clients map[string]*clientBucket
	swept   time.Time
}

type clientBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

func newRateLimiter(perSecond float64, burst int) *rateLimiter {
	return &rateLimiter{perSecond: rate.Limit(perSecond), burst: burst, clients: map[string]*clientBucket{}}
}

// allow reports whether the client may send a request now, and if not,
// how long until it may.
func (l *rateLimiter) allow(client string) (bool, time.Duration) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.swept) > time.Minute {
		for k, c := range l.clients {
			if now.Sub(c.seen) > 10*time.Minute {
				delete(l.clients, k)
			}
		}
		l.swept = now
	}
	c, ok := l.clients[client]
	if !ok {
		c = &clientBucket{lim: rate.NewLimiter(l.perSecond, l.burst)}
		l.clients[client] = c
	}
	c.seen = now
	r := c.lim.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// limit wraps next with the rate limit, one bucket per what key(r)
// returns: over it, 429 with Retry-After (which the E2B SDKs honour).
func (l *rateLimiter) limit(next http.Handler, key func(*http.Request) string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ok, wait := l.allow(key(r)); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
			writeError(w, http.StatusTooManyRequests, "too many requests; retry after "+wait.Round(time.Millisecond).String())
			return
		}
		next.ServeHTTP(w, r)
	})
}

// clientKey names who sent a control-plane request, for its rate-limit
// bucket: the API key when it is a valid one (clients behind one address,
// such as RL trainers behind a NAT, each get their own), else the client's
// address. An invalid key must not buy a fresh bucket, so it counts as
// the address.
func (s *Server) clientKey(r *http.Request) string {
	// A key's id is derived from its hash: the key itself never names a
	// bucket.
	if k, ok := s.lookupKey(r); ok {
		return "key:" + k.ID
	}
	return "addr:" + s.clientAddr(r).String()
}

// clientAddr is the address a request came from: the peer's, or, when the
// peer is one of the trusted proxies, the last address in X-Forwarded-For
// that is not one of them.
func (s *Server) clientAddr(r *http.Request) netip.Addr {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	addr := peer.Addr().Unmap()
	if !s.trusted(addr) {
		return addr
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break
		}
		if a = a.Unmap(); !s.trusted(a) {
			return a
		}
	}
	return addr
}

func (s *Server) trusted(a netip.Addr) bool {
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// sandboxKey names the sandbox a proxied request is for, for the proxy's
// rate limit: one busy sandbox must not slow the others.
func sandboxKey(r *http.Request) string {
	id, _, _ := proxy.Match(r)
	return "sandbox:" + id
}
