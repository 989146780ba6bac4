package cluster

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/state"
)

// readCounter counts the reads of sandbox records and tombstones, the
// ones a route lookup may cause.
type readCounter struct {
	state.Store
	reads atomic.Int64
}

func (s *readCounter) Get(ctx context.Context, key string) (state.Entry, error) {
	if strings.HasPrefix(key, sandboxPrefix) || strings.HasPrefix(key, tombstonePrefix) {
		s.reads.Add(1)
	}
	return s.Store.Get(ctx, key)
}

// TestRouteUnknown: an unknown id costs one store read, and its repeats
// none while the store's answer is fresh; a record another server writes
// right after is routed as soon as the watch brings it, long before that
// answer would go stale.
func TestRouteUnknown(t *testing.T) {
	ctx := context.Background()
	st := &readCounter{Store: state.NewMemory()}
	c := openCluster(t, st, nodetest.NewFake("n1"))
	own := create(t, c, time.Hour)

	st.reads.Store(0)
	for range 5 {
		if _, err := c.Route(ctx, "nosuch"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("route of an unknown id: %v, want ErrNotFound", err)
		}
	}
	if n := st.reads.Load(); n != 1 {
		t.Fatalf("5 lookups of one unknown id read the store %d times, want 1", n)
	}
	if !c.RouteCached("nosuch") || !c.RouteCached(own.ID) || c.RouteCached("other") {
		t.Fatalf("RouteCached: unknown %v, own %v, never asked %v; want true, true, false",
			c.RouteCached("nosuch"), c.RouteCached(own.ID), c.RouteCached("other"))
	}

	// "late" is asked for, then another server records it.
	if _, err := c.Route(ctx, "late"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("route before the record: %v", err)
	}
	b, err := encodeRecord(nil, &record{Sandbox: Sandbox{ID: "late", NodeID: own.NodeID, State: StateRunning, Addr: netip.MustParseAddr("10.0.0.7")}})
	if err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	if _, err := st.Store.Create(ctx, sandboxKey("late"), b, state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	var r Route
	waitFor(t, func() bool { r, err = c.Route(ctx, "late"); return err == nil }, "the late record to be routed")
	if took := time.Since(written); took >= unknownFor || r.Addr != netip.MustParseAddr("10.0.0.7") {
		t.Fatalf("late record routed to %v after %v; want 10.0.0.7 well within %v", r.Addr, took, unknownFor)
	}
}

// TestUnknownIDs: an entry answers for unknownFor, and past the cap the
// oldest goes.
func TestUnknownIDs(t *testing.T) {
	u := newUnknownIDs(3)
	t0 := time.Now()
	u.add("a", t0)
	if !u.has("a", t0.Add(unknownFor-time.Millisecond)) || u.has("a", t0.Add(unknownFor)) {
		t.Fatal("an unknown id must be remembered for unknownFor, and no longer")
	}
	for _, id := range []string{"a", "b", "c", "d"} {
		u.add(id, t0)
	}
	if u.has("a", t0) || !u.has("b", t0) || !u.has("d", t0) || u.ids.Len() != 3 {
		t.Fatalf("past the cap of 3: len %d, a %v b %v d %v; want the oldest (a) gone", u.ids.Len(), u.has("a", t0), u.has("b", t0), u.has("d", t0))
	}
}

// stuckStore never answers a read until its caller gives up, as an etcd
// without quorum may not.
type stuckStore struct{ state.Store }

func (s stuckStore) Get(ctx context.Context, key string) (state.Entry, error) {
	<-ctx.Done()
	return state.Entry{}, ctx.Err()
}

// TestRouteTimeout: a lookup the store does not answer ends by
// lookupTimeout, even for a caller that would wait for ever.
func TestRouteTimeout(t *testing.T) {
	c := openCluster(t, stuckStore{state.NewMemory()}, nodetest.NewFake("n1"))
	start := time.Now()
	_, err := c.Route(context.Background(), "abc")
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > lookupTimeout+time.Second {
		t.Fatalf("route with a stuck store: %v after %v; want a deadline error by %v", err, took, lookupTimeout)
	}
	if c.RouteCached("abc") {
		t.Fatal("a lookup that timed out must not be remembered as unknown")
	}
}
