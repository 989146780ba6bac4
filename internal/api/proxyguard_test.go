package api

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/proxy"
	"github.com/aenvhq/aenv/internal/state"
)

// readCounter counts every read of the state store.
type readCounter struct {
	state.Store
	reads atomic.Int64
}

func (s *readCounter) Get(ctx context.Context, key string) (state.Entry, error) {
	s.reads.Add(1)
	return s.Store.Get(ctx, key)
}

func (s *readCounter) List(ctx context.Context, prefix string) ([]state.Entry, int64, error) {
	s.reads.Add(1)
	return s.Store.List(ctx, prefix)
}

// clusterRoutes resolves sandboxes as the server does (without its
// automatic resume).
type clusterRoutes struct{ c *cluster.Cluster }

func (r clusterRoutes) SandboxRoute(ctx context.Context, id string) (proxy.Route, error) {
	rt, err := r.c.Route(ctx, id)
	return proxy.Route{Addr: rt.Addr, Via: rt.Via, TrafficToken: rt.TrafficToken}, err
}

// proxyServer is the API in front of the proxy, on a cluster with no
// sandboxes whose records are in st: every valid id is unknown.
func proxyServer(t *testing.T, st state.Store, cfg Config) *Handler {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	c, err := cluster.Open(context.Background(), cluster.Config{State: st, Candidate: "proxy-test", Logger: log,
		Dial: func(id, address string) nodeapi.Node { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background(), cluster.StopKeep) })
	cfg.Cluster, cfg.Proxy, cfg.Logger = c, proxy.New(clusterRoutes{c}, nil, log), log
	return New(cfg)
}

// TestProxyLookupLimit: lookups that need the store are limited per
// client address (the forwarded one behind a trusted proxy, the /64 of an
// IPv6 one); what the server answers from memory (an id it just found
// unknown, an id not of the id form) is not, and costs no read.
func TestProxyLookupLimit(t *testing.T) {
	st := &readCounter{Store: state.NewMemory()}
	s := proxyServer(t, st, Config{ProxyRateLimit: 1000, ProxyRateBurst: 2000,
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}})
	n := 0
	send := func(addr, xff, id string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/health", nil)
		r.RemoteAddr = addr
		r.Header.Set(proxy.HeaderSandboxID, id)
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}
	fresh := func() string { n++; return fmt.Sprintf("unknown%d", n) }

	st.reads.Store(0)
	for i := range lookupBurst {
		if w := send("1.2.3.4:1", "", fresh()); w.Code != http.StatusBadGateway {
			t.Fatalf("lookup %d within the budget: %d %s, want 502 (unknown sandbox)", i, w.Code, w.Body)
		}
	}
	if got := st.reads.Load(); got != lookupBurst {
		t.Fatalf("%d lookups of unknown ids read the store %d times, want one each", lookupBurst, got)
	}
	w := send("1.2.3.4:2", "", fresh())
	if s, err := strconv.Atoi(w.Header().Get("Retry-After")); w.Code != http.StatusTooManyRequests || err != nil || s < 1 {
		t.Fatalf("a lookup over the budget: %d, Retry-After %q; want 429 with it", w.Code, w.Header().Get("Retry-After"))
	}
	// Over its budget, the address still gets what costs no read.
	for id, want := range map[string]int{"unknown1": http.StatusBadGateway, strings.Repeat("x", 64<<10): http.StatusBadRequest, "../etc": http.StatusBadRequest} {
		if w := send("1.2.3.4:3", "", id); w.Code != want {
			t.Fatalf("id %.10q answered from memory: %d, want %d", id, w.Code, want)
		}
	}
	if w := send("5.6.7.8:1", "", fresh()); w.Code != http.StatusBadGateway {
		t.Fatalf("another address: %d, want its own budget", w.Code)
	}
	if w := send("10.9.0.5:1", "", fresh()); w.Code != http.StatusBadGateway {
		t.Fatalf("a trusted proxy's own request: %d, want its own budget", w.Code)
	}
	if w := send("10.9.0.5:1", "1.2.3.4", fresh()); w.Code != http.StatusTooManyRequests {
		t.Fatalf("the spent client behind a trusted proxy: %d, want 429", w.Code)
	}
	if w := send("8.8.8.8:1", "5.5.5.5", fresh()); w.Code != http.StatusBadGateway {
		t.Fatalf("X-Forwarded-For from an untrusted peer: %d, want the peer's own budget", w.Code)
	}
	for range lookupBurst {
		send("[2001:db8:1::1]:1", "", fresh())
	}
	if w := send("[2001:db8:1::ffff]:1", "", fresh()); w.Code != http.StatusTooManyRequests {
		t.Fatalf("another address of a spent /64: %d, want 429", w.Code)
	}
	if w := send("[2001:db8:2::1]:1", "", fresh()); w.Code != http.StatusBadGateway {
		t.Fatalf("another /64: %d, want its own budget", w.Code)
	}
}

// TestRateLimitCap: past the cap the least recently used bucket goes, so
// a flood of new keys neither grows the limiter nor frees a client that
// keeps sending; a bucket that has refilled is dropped on its own.
func TestRateLimitCap(t *testing.T) {
	l := newRateLimiter(1, 1)
	l.buckets.Resize(3)
	if ok, _ := l.allow("hot"); !ok {
		t.Fatal("first request refused")
	}
	for i := range 1000 {
		if ok, _ := l.allow(fmt.Sprintf("new%d", i)); !ok {
			t.Fatalf("new key %d refused", i)
		}
		if ok, _ := l.allow("hot"); ok {
			t.Fatalf("after %d new keys the spent client got through: its bucket was evicted", i)
		}
		if n := l.buckets.Len(); n > 3 {
			t.Fatalf("%d buckets, cap 3", n)
		}
	}
	if ok, _ := l.allow("new0"); !ok {
		t.Fatal("an evicted key starts again with a full bucket")
	}

	l = newRateLimiter(1000, 1) // refills in 1 ms
	l.allow("a")
	l.allow("b")
	time.Sleep(5 * time.Millisecond)
	l.allow("c")
	if n := l.buckets.Len(); n != 1 {
		t.Fatalf("%d buckets after the others refilled, want 1", n)
	}
}

// TestProxyFlood: 100,000 requests with made-up sandbox ids and no key,
// each from its own address (all in one IPv6 /64, as one host can send),
// cost a handful of store reads in all and leave the heap and the RSS
// where they were.
func TestProxyFlood(t *testing.T) {
	st := &readCounter{Store: state.NewMemory()}
	s := proxyServer(t, st, Config{ProxyRateLimit: 1000, ProxyRateBurst: 2000})
	junk := strings.Repeat("x", 64<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	id := make([]byte, 20)
	codes := map[int]int{}
	flood := func(n int) {
		for i := range n {
			r := httptest.NewRequest("GET", "/health", nil)
			var a [16]byte
			copy(a[:], netip.MustParseAddr("2001:db8:7::").AsSlice())
			for j := 8; j < 16; j++ {
				a[j] = byte(rng.Uint32())
			}
			r.RemoteAddr = netip.AddrPortFrom(netip.AddrFrom16(a), 40000).String()
			for j := range id {
				id[j] = alphabet[rng.IntN(len(alphabet))]
			}
			switch {
			case i%10 == 0:
				r.Header.Set(proxy.HeaderSandboxID, junk)
			case i%10 == 1:
				r.Header.Set(proxy.HeaderSandboxID, "Not_An-Id")
			case i%2 == 0:
				r.Host = "49983-" + string(id) + ".aenv.test"
			default:
				r.Header.Set(proxy.HeaderSandboxID, string(id))
			}
			w := httptest.NewRecorder()
			s.ServeHTTP(w, r)
			codes[w.Code]++
		}
	}
	// The first requests take what any traffic would (pools, the heap the
	// collector settles at): the baseline is a server that has served.
	flood(10_000)
	clear(codes)
	heap0, rss0 := memUse(t)
	reads0 := st.reads.Load()
	start := time.Now()
	flood(100_000)
	elapsed := time.Since(start)
	reads := st.reads.Load() - reads0
	heap1, rss1 := memUse(t)
	t.Logf("%v for 100,000 requests; %d store reads; answers %v; heap %+.1f MiB, RSS %+.1f MiB", elapsed, reads, codes,
		float64(heap1-heap0)/(1<<20), float64(rss1-rss0)/(1<<20))

	// The address's budget, plus the first flood's unspent part, plus a
	// few background reads of the cluster's own.
	if limit := int64(lookupBurst + lookupRate*elapsed.Seconds() + 5); reads > limit {
		t.Errorf("the flood read the store %d times, want at most %d", reads, limit)
	}
	if answered := codes[http.StatusBadRequest] + codes[http.StatusBadGateway]; answered+codes[http.StatusTooManyRequests] != 100_000 || answered < 20_000 {
		t.Errorf("answers %v: want 400 for every id not of the id form, 502 (unknown) for those looked up, 429 for the rest", codes)
	}
	if d := heap1 - heap0; d > 20<<20 {
		t.Errorf("the heap grew by %.1f MiB, want < 20", float64(d)/(1<<20))
	}
	if d := rss1 - rss0; d > 20<<20 {
		t.Errorf("the RSS grew by %.1f MiB, want < 20", float64(d)/(1<<20))
	}
}

// memUse is the live heap after a collection and the process's RSS.
func memUse(t *testing.T) (heap, rss int64) {
	t.Helper()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Fatalf("reading the RSS: %v", err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatalf("reading the RSS: %q: %v", b, err)
	}
	return int64(m.HeapAlloc), pages * int64(os.Getpagesize())
}
