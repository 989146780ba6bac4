package api

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestRateLimit(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := newRateLimiter(1, 3).limit(ok, (&Handler{}).clientKey)
	send := func(addr string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/v2/sandboxes", nil)
		req.RemoteAddr = addr
		h.ServeHTTP(rec, req)
		return rec
	}
	for i := range 3 {
		if rec := send("10.0.0.1:1234"); rec.Code != http.StatusNoContent {
			t.Fatalf("request %d within the burst: %d", i, rec.Code)
		}
	}
	rec := send("10.0.0.1:5678")
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("request over the burst: %d, want 429", rec.Code)
	}
	if s, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || s < 1 {
		t.Fatalf("Retry-After %q", rec.Header().Get("Retry-After"))
	}
	// Another client has its own bucket.
	if rec := send("10.0.0.2:1"); rec.Code != http.StatusNoContent {
		t.Fatalf("another client was limited: %d", rec.Code)
	}
}

// TestRateLimitKeys: a valid API key has its own bucket wherever its
// requests come from; an invalid one counts as its address; behind a
// trusted proxy the forwarded address counts; each sandbox has its own
// bucket in the proxy.
func TestRateLimitKeys(t *testing.T) {
	s := &Handler{cfg: Config{APIKey: "e2b_good", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}}}
	req := func(addr, key, xff string) *http.Request {
		r := httptest.NewRequest("GET", "/v2/sandboxes", nil)
		r.RemoteAddr = addr
		if key != "" {
			r.Header.Set("X-API-Key", key)
		}
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		return r
	}
	a, b := s.clientKey(req("1.2.3.4:1", "e2b_good", "")), s.clientKey(req("5.6.7.8:1", "e2b_good", ""))
	if a != b || !strings.HasPrefix(a, "key:") || strings.Contains(a, "e2b_good") {
		t.Fatalf("one valid key from two addresses: %q and %q, want one hashed key bucket", a, b)
	}
	if k := s.clientKey(req("1.2.3.4:1", "e2b_random", "")); k != "addr:1.2.3.4" {
		t.Fatalf("an invalid key: %q, want the address's bucket", k)
	}
	if k := s.clientKey(req("10.9.0.5:1", "", "7.7.7.7, 10.9.1.1")); k != "addr:7.7.7.7" {
		t.Fatalf("behind a trusted proxy: %q, want the forwarded client", k)
	}
	if k := s.clientKey(req("8.8.8.8:1", "", "7.7.7.7")); k != "addr:8.8.8.8" {
		t.Fatalf("X-Forwarded-For from an untrusted peer: %q, want the peer", k)
	}
	p := httptest.NewRequest("GET", "/", nil)
	p.Header.Set("E2b-Sandbox-Id", "abc")
	q := httptest.NewRequest("GET", "/", nil)
	q.Host = "49983-def.localhost"
	if sandboxKey(p) == sandboxKey(q) || sandboxKey(p) != "sandbox:abc" {
		t.Fatalf("sandbox buckets: %q, %q", sandboxKey(p), sandboxKey(q))
	}
}

// TestLimitSignIn: the console's sign-ins are bounded per client address,
// with or without a key in them (a guess carries one): a burst of
// signInBurst, then 429 with Retry-After; another address has its own;
// behind a trusted proxy the forwarded client counts.
func TestLimitSignIn(t *testing.T) {
	s := New(Config{APIKey: "e2b_good", TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}})
	h := s.LimitSignIn(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusUnauthorized) }))
	send := func(addr, xff string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("POST", "/console/session", strings.NewReader(`{"apiKey":"e2b_guess"}`))
		req.RemoteAddr = addr
		if xff != "" {
			req.Header.Set("X-Forwarded-For", xff)
		}
		h.ServeHTTP(rec, req)
		return rec
	}
	for i := range signInBurst {
		if rec := send("1.2.3.4:1", ""); rec.Code != http.StatusUnauthorized {
			t.Fatalf("sign-in %d within the burst: %d, want the handler's 401", i, rec.Code)
		}
	}
	rec := send("1.2.3.4:2", "")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("sign-in over the burst: %d (Retry-After %q), want 429 with Retry-After", rec.Code, rec.Header().Get("Retry-After"))
	}
	if rec := send("5.6.7.8:1", ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("another address: %d, want its own bucket", rec.Code)
	}
	// Through a trusted proxy, the forwarded client is limited, not the
	// proxy: 1.2.3.4 behind it is over, 7.7.7.7 is not.
	if rec := send("10.9.0.5:1", "1.2.3.4"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("the limited client through a trusted proxy: %d, want 429", rec.Code)
	}
	if rec := send("10.9.0.5:1", "7.7.7.7"); rec.Code != http.StatusUnauthorized {
		t.Fatalf("another client through the proxy: %d, want its own bucket", rec.Code)
	}
}
