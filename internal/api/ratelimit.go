package api

import (
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// rateLimiter bounds control-plane requests per client address, so that
// one runaway client cannot starve the others (sandbox traffic through the
// proxy is not limited here). Idle clients' buckets are dropped.
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

// limit wraps next with the rate limit: over it, 429 with Retry-After
// (which the E2B SDKs honour).
func (l *rateLimiter) limit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		if ok, wait := l.allow(host); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
			writeError(w, http.StatusTooManyRequests, "too many requests; retry after "+wait.Round(time.Millisecond).String())
			return
		}
		next.ServeHTTP(w, r)
	})
}
