package api

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"golang.org/x/time/rate"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/proxy"
)

// rateLimiter bounds requests per client (API key or address) or per
// sandbox, so that one runaway client or sandbox cannot starve the others.
// It is safe for concurrent use.
//
// Its buckets are bounded in number, whatever clients send: a bucket that
// has refilled is dropped (it is the same as a new one), and past
// maxBuckets the least recently used goes. Refusing new buckets instead
// would let one flood of made-up keys lock every new client out (or, let
// through unlimited, buy the flood a pass); evicting costs only the
// evicted client's state, which is a full bucket's unless it was seen in
// the last refill time, and the clients a limit matters for (those sending
// now) are the most recently used.
type rateLimiter struct {
	perSecond rate.Limit
	burst     int
	// idle is how long an empty bucket takes to refill.
	idle time.Duration

	mu      sync.Mutex
	buckets *simplelru.LRU[string, *clientBucket] // least recently seen first
}

type clientBucket struct {
	lim  *rate.Limiter
	seen time.Time
}

// maxBuckets bounds a limiter's buckets: ~250 bytes each (measured, with
// a sandbox's key), so ~25 MiB at most, for as many clients (or
// sandboxes) as send within a refill time.
const maxBuckets = 100_000

// maxIdle bounds how long an idle bucket is kept when its refill takes
// longer (a limit of less than burst per 10 minutes).
const maxIdle = 10 * time.Minute

func newRateLimiter(perSecond float64, burst int) *rateLimiter {
	buckets, _ := simplelru.NewLRU[string, *clientBucket](maxBuckets, nil)
	idle := maxIdle
	if secs := float64(burst) / perSecond; secs < maxIdle.Seconds() {
		idle = time.Duration(secs * float64(time.Second))
	}
	return &rateLimiter{perSecond: rate.Limit(perSecond), burst: burst, idle: idle, buckets: buckets}
}

// allow reports whether the client may send a request now, and if not,
// how long until it may.
func (l *rateLimiter) allow(client string) (bool, time.Duration) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		_, c, ok := l.buckets.GetOldest()
		if !ok || now.Sub(c.seen) < l.idle {
			break
		}
		l.buckets.RemoveOldest()
	}
	c, ok := l.buckets.Get(client)
	if !ok {
		c = &clientBucket{lim: rate.NewLimiter(l.perSecond, l.burst)}
		l.buckets.Add(client, c)
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
			tooMany(w, wait)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func tooMany(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(wait/time.Second)+1))
	writeError(w, http.StatusTooManyRequests, "too many requests; retry after "+wait.Round(time.Millisecond).String())
}

// A lookup of a sandbox the cluster does not hold in memory costs a read
// of the state store, so each client address may cause only lookupRate of
// them per second (burst lookupBurst); the rest get 429. Clients learn
// sandbox ids from creates, whose records this server holds (its own at
// once, another server's milliseconds later), and an id found gone is
// answered from memory for a while after: a client that sends more is
// guessing. Proxied requests carry no API key, so the address is all
// there is to count by.
const (
	lookupRate  = 10
	lookupBurst = 20
)

// Console sign-ins per client address: a person signs in a few times a
// day; a script trying keys gets signInBurst, then one a second.
const (
	signInRate  = 1
	signInBurst = 10
)

// LimitSignIn bounds what next serves per client address (as the API
// counts addresses, behind trusted proxies too) to signInRate a second
// after a burst of signInBurst: over it, 429 with Retry-After. The web
// console puts its sign-in behind it, which no API key names.
func (s *Handler) LimitSignIn(next http.Handler) http.Handler {
	return s.signIns.limit(next, func(r *http.Request) string { return s.clientAddr(r).String() })
}

// guardProxy puts the proxy behind its limits, the cheapest first, so
// that junk costs neither a store read per request nor memory per id:
//   - an id that is not of the id form goes straight to the proxy, which
//     answers it as an unknown sandbox before any lookup; it takes no
//     bucket;
//   - a lookup that needs the store counts against the client address
//     (lookupRate);
//   - then each sandbox has its own limit (ProxyRateLimit), so that one
//     busy sandbox does not slow the others.
func (s *Handler) guardProxy(p http.Handler) http.Handler {
	perSandbox := p
	if s.cfg.ProxyRateLimit > 0 {
		perSandbox = newRateLimiter(s.cfg.ProxyRateLimit, max(s.cfg.ProxyRateBurst, 1)).limit(p, sandboxKey)
	}
	lookups := newRateLimiter(lookupRate, lookupBurst)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _, _ := proxy.Match(r)
		if !ids.Valid(id) {
			p.ServeHTTP(w, r)
			return
		}
		if s.cfg.Cluster != nil && !s.cfg.Cluster.RouteCached(id) {
			if ok, wait := lookups.allow(addrKey(s.clientAddr(r))); !ok {
				tooMany(w, wait)
				return
			}
		}
		perSandbox.ServeHTTP(w, r)
	})
}

// addrKey names a client address's bucket. An IPv6 client counts by its
// /64, which is one site's (a host has as many addresses in it as it
// likes, and would otherwise take a fresh bucket per request).
func addrKey(a netip.Addr) string {
	if a.Is6() {
		p, _ := a.Prefix(64)
		return "addr:" + p.String()
	}
	return "addr:" + a.String()
}

// clientKey names who sent a control-plane request, for its rate-limit
// bucket: the API key when it is a valid one (clients behind one address,
// such as RL trainers behind a NAT, each get their own), else the client's
// address. An invalid key must not buy a fresh bucket, so it counts as
// the address.
func (s *Handler) clientKey(r *http.Request) string {
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
func (s *Handler) clientAddr(r *http.Request) netip.Addr {
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

func (s *Handler) trusted(a netip.Addr) bool {
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
