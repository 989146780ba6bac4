package api

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

func TestRateLimit(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	h := newRateLimiter(1, 3).limit(ok)
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
