// Package statetest is the conformance suite for state.Store: every
// implementation runs it, so that what a unit test learns on NewMemory
// holds on etcd. Only tests import it.
package statetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// TTL is the lease TTL the suite uses: etcd's minimum with its default
// election timeout is 2 s (1.5 election timeouts, rounded up).
const TTL = 2 * time.Second

// wait bounds anything the suite waits for that should happen "soon".
const wait = 10 * time.Second

// Run runs the suite. open returns a fresh, empty Store for one subtest
// (stores may share a backend if their key spaces do not overlap) and
// closes it in t.Cleanup; Close may be called on it once more by the
// suite. Subtests run in parallel.
func Run(t *testing.T, open func(t *testing.T) state.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, st state.Store)
	}{
		{"CRUD", testCRUD},
		{"Bytes", testBytes},
		{"UnknownLease", testUnknownLease},
		{"ListPrefix", testListPrefix},
		{"ListMany", testListMany},
		{"WatchFromList", testWatchFromList},
		{"WatchCancel", testWatchCancel},
		{"SessionClose", testSessionClose},
		{"SessionExpiry", testSessionExpiry},
		{"Campaign", testCampaign},
		{"CampaignFIFO", testCampaignFIFO},
		{"CampaignCancel", testCampaignCancel},
		{"Evict", testEvict},
		{"CASRace", testCASRace},
		{"Closed", testClosed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// must(call())(t) fails t if call failed, and returns its value.
func must[T any](v T, err error) func(t *testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func wantErr(t *testing.T, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("error %v, want %v", err, class)
	}
}

func testCRUD(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	k := "sandboxes/abc"
	rev1 := must(st.Create(ctx, k, []byte("v1"), state.WriteOptions{}))(t)
	if rev1 <= 0 {
		t.Fatalf("Create revision %d, want > 0", rev1)
	}
	e := must(st.Get(ctx, k))(t)
	if e.Key != k || string(e.Value) != "v1" || e.Revision != rev1 || e.Lease != 0 {
		t.Fatalf("Get = %+v, want %s=v1 at %d without lease", e, k, rev1)
	}
	_, err := st.Create(ctx, k, []byte("again"), state.WriteOptions{})
	wantErr(t, err, state.ErrExists)

	rev2 := must(st.Update(ctx, k, []byte("v2"), rev1, state.WriteOptions{}))(t)
	if rev2 <= rev1 {
		t.Fatalf("Update revision %d, want > %d", rev2, rev1)
	}
	_, err = st.Update(ctx, k, []byte("stale"), rev1, state.WriteOptions{})
	wantErr(t, err, state.ErrConflict)
	_, err = st.Update(ctx, "sandboxes/missing", []byte("x"), rev1, state.WriteOptions{})
	wantErr(t, err, state.ErrNotFound)
	if e := must(st.Get(ctx, k))(t); string(e.Value) != "v2" || e.Revision != rev2 {
		t.Fatalf("after stale Update, Get = %+v, want v2 at %d", e, rev2)
	}

	rev3 := must(st.Put(ctx, k, []byte("v3"), state.WriteOptions{}))(t)
	if rev3 <= rev2 {
		t.Fatalf("Put revision %d, want > %d", rev3, rev2)
	}
	rev4 := must(st.Put(ctx, "sandboxes/new", []byte("n"), state.WriteOptions{}))(t)
	if rev4 <= rev3 {
		t.Fatalf("Put of a new key revision %d, want > %d", rev4, rev3)
	}

	wantErr(t, st.Delete(ctx, k, rev2), state.ErrConflict)
	if err := st.Delete(ctx, k, rev3); err != nil {
		t.Fatal(err)
	}
	_, err = st.Get(ctx, k)
	wantErr(t, err, state.ErrNotFound)
	wantErr(t, st.Delete(ctx, k, 0), state.ErrNotFound)
	wantErr(t, st.Delete(ctx, k, rev3), state.ErrNotFound)
	if err := st.Delete(ctx, "sandboxes/new", 0); err != nil {
		t.Fatal(err)
	}
	// A deleted key can be created again.
	rev5 := must(st.Create(ctx, k, []byte("v5"), state.WriteOptions{}))(t)
	if rev5 <= rev4 {
		t.Fatalf("re-Create revision %d, want > %d", rev5, rev4)
	}
}

func testBytes(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	all := make([]byte, 0, 512)
	for i := range 512 {
		all = append(all, byte(i))
	}
	values := map[string][]byte{
		"b/all":     all,
		"b/nul":     {0, 0, 0},
		"b/invalid": {0xff, 0xfe, 0xc3, 0x28},
		"b/empty":   {},
	}
	for k, v := range values {
		must(st.Put(ctx, k, v, state.WriteOptions{}))(t)
	}
	// The caller's buffer is not the store's.
	buf := []byte("mutable")
	must(st.Put(ctx, "b/mutable", buf, state.WriteOptions{}))(t)
	buf[0] = 'X'
	values["b/mutable"] = []byte("mutable")
	for k, v := range values {
		e := must(st.Get(ctx, k))(t)
		if !bytes.Equal(e.Value, v) || e.Value == nil {
			t.Errorf("Get(%s) = %q, want %q (non-nil)", k, e.Value, v)
		}
	}
}

func testUnknownLease(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	if _, err := st.Put(ctx, "l/k", []byte("v"), state.WriteOptions{Lease: 0x7eadbeef}); err == nil {
		t.Fatal("Put with an unknown lease succeeded")
	}
	_, err := st.Get(ctx, "l/k")
	wantErr(t, err, state.ErrNotFound)
}

func testListPrefix(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	for _, k := range []string{"sandboxes/b", "sandboxes2/x", "sandboxes/a", "sandbox", "other/sandboxes/z", "sandboxes/c/d"} {
		must(st.Put(ctx, k, []byte(k), state.WriteOptions{}))(t)
	}
	last := must(st.Put(ctx, "zzz", []byte("last"), state.WriteOptions{}))(t)
	es, rev, err := st.List(ctx, "sandboxes/")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		if string(e.Value) != e.Key {
			t.Errorf("entry %s has value %q", e.Key, e.Value)
		}
		got = append(got, e.Key)
	}
	if want := "[sandboxes/a sandboxes/b sandboxes/c/d]"; fmt.Sprint(got) != want {
		t.Fatalf("List(sandboxes/) = %v, want %s", got, want)
	}
	if rev < last {
		t.Fatalf("List revision %d, want >= %d", rev, last)
	}
	es, rev, err = st.List(ctx, "nothing/")
	if err != nil || len(es) != 0 || rev < last {
		t.Fatalf("List(nothing/) = %v, %d, %v; want none at >= %d", es, rev, err, last)
	}
}

// testListMany crosses the etcd implementation's page size (1,000), so
// that paging can neither drop nor repeat keys.
func testListMany(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	const n = 2500
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				k := fmt.Sprintf("many/%05d", i)
				if _, err := st.Create(ctx, k, []byte(strconv.Itoa(i)), state.WriteOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	must(st.Put(ctx, "many0", []byte("outside"), state.WriteOptions{}))(t)
	es, _, err := st.List(ctx, "many/")
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != n {
		t.Fatalf("List returned %d entries, want %d", len(es), n)
	}
	for i, e := range es {
		if want := fmt.Sprintf("many/%05d", i); e.Key != want || string(e.Value) != strconv.Itoa(i) {
			t.Fatalf("entry %d = %s=%q, want %s=%d", i, e.Key, e.Value, want, i)
		}
	}
}

func next(t *testing.T, ch <-chan state.Event) state.Event {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return ev
	case <-time.After(wait):
		t.Fatal("no event")
	}
	panic("unreachable")
}

func testWatchFromList(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	must(st.Put(ctx, "w/a", []byte("a0"), state.WriteOptions{}))(t)
	must(st.Put(ctx, "w/b", []byte("b0"), state.WriteOptions{}))(t)
	_, rev, err := st.List(ctx, "w/")
	if err != nil {
		t.Fatal(err)
	}
	// One change before the watch starts, the rest after: a watch from
	// List's revision must see both, and nothing from before it.
	r1 := must(st.Put(ctx, "w/c", []byte("c1"), state.WriteOptions{}))(t)
	must(st.Put(ctx, "wx", []byte("outside"), state.WriteOptions{}))(t)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := st.Watch(wctx, "w/", rev)
	a := must(st.Get(ctx, "w/a"))(t)
	r2 := must(st.Update(ctx, "w/a", []byte("a2"), a.Revision, state.WriteOptions{}))(t)
	if err := st.Delete(ctx, "w/b", 0); err != nil {
		t.Fatal(err)
	}
	r4 := must(st.Put(ctx, "w/d", []byte("d4"), state.WriteOptions{}))(t)

	want := []struct {
		typ   state.EventType
		key   string
		value string
	}{
		{state.EventPut, "w/c", "c1"},
		{state.EventPut, "w/a", "a2"},
		{state.EventDelete, "w/b", ""},
		{state.EventPut, "w/d", "d4"},
	}
	var revs []int64
	for i, w := range want {
		ev := next(t, ch)
		if ev.Err != nil {
			t.Fatalf("event %d: %v", i, ev.Err)
		}
		if ev.Type != w.typ || ev.Entry.Key != w.key || string(ev.Entry.Value) != w.value {
			t.Fatalf("event %d = %v %s=%q, want %v %s=%q", i, ev.Type, ev.Entry.Key, ev.Entry.Value, w.typ, w.key, w.value)
		}
		revs = append(revs, ev.Entry.Revision)
	}
	if revs[0] != r1 || revs[1] != r2 || revs[2] <= r2 || revs[3] != r4 || revs[2] >= r4 {
		t.Fatalf("event revisions %v, want %d, %d, between, %d", revs, r1, r2, r4)
	}
	select {
	case ev := <-ch:
		t.Fatalf("unexpected event %+v", ev)
	case <-time.After(200 * time.Millisecond):
	}
}

func testWatchCancel(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	_, rev, err := st.List(ctx, "wc/")
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	ch := st.Watch(wctx, "wc/", rev)
	must(st.Put(ctx, "wc/a", []byte("a"), state.WriteOptions{}))(t)
	if ev := next(t, ch); ev.Err != nil || ev.Entry.Key != "wc/a" {
		t.Fatalf("event %+v, want put wc/a", ev)
	}
	cancel()
	deadline := time.After(wait)
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return
			}
			if ev.Err == nil {
				t.Fatalf("event %+v after cancel", ev)
			}
		case <-deadline:
			t.Fatal("watch channel still open after its ctx ended")
		}
	}
}

func closed(ch <-chan struct{}, within time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(within):
		return false
	}
}

func testSessionClose(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	s := must(st.NewSession(ctx, TTL))(t)
	if s.Lease() == 0 {
		t.Fatal("session has lease 0")
	}
	_, rev, err := st.List(ctx, "nodes/")
	if err != nil {
		t.Fatal(err)
	}
	ch := st.Watch(ctx, "nodes/", rev)
	must(st.Create(ctx, "nodes/n1", []byte("alive"), state.WriteOptions{Lease: s.Lease()}))(t)
	must(st.Put(ctx, "nodes/n2", []byte("alive"), state.WriteOptions{Lease: s.Lease()}))(t)
	must(st.Put(ctx, "nodes/free", []byte("no lease"), state.WriteOptions{}))(t)
	if e := must(st.Get(ctx, "nodes/n1"))(t); e.Lease != s.Lease() {
		t.Fatalf("entry lease %x, want %x", e.Lease, s.Lease())
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"nodes/n1", "nodes/n2"} {
		_, err := st.Get(ctx, k)
		wantErr(t, err, state.ErrNotFound)
	}
	must(st.Get(ctx, "nodes/free"))(t)
	if !closed(s.Done(), wait) {
		t.Fatal("Done not closed after Close")
	}
	seen := map[string]state.EventType{}
	for range 5 {
		ev := next(t, ch)
		if ev.Err != nil {
			t.Fatal(ev.Err)
		}
		seen[ev.Entry.Key] = ev.Type
	}
	if seen["nodes/n1"] != state.EventDelete || seen["nodes/n2"] != state.EventDelete {
		t.Fatalf("watch saw %v, want the lease's keys deleted", seen)
	}
	// Writing with a revoked lease fails.
	if _, err := st.Put(ctx, "nodes/n3", []byte("late"), state.WriteOptions{Lease: s.Lease()}); err == nil {
		t.Fatal("Put with a revoked lease succeeded")
	}
}

func testSessionExpiry(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	s := must(st.NewSession(sctx, TTL))(t)
	must(st.Put(ctx, "nodes/n1", []byte("alive"), state.WriteOptions{Lease: s.Lease()}))(t)
	// Kept alive, the key outlives its TTL.
	time.Sleep(TTL + TTL/2)
	if _, err := st.Get(ctx, "nodes/n1"); err != nil {
		t.Fatalf("kept-alive key: %v", err)
	}
	// The session's ctx ending stops the keepalives: the lease expires.
	stop()
	start := time.Now()
	for {
		_, err := st.Get(ctx, "nodes/n1")
		if errors.Is(err, state.ErrNotFound) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(start) > TTL+wait {
			t.Fatal("leased key still there long after its TTL")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !closed(s.Done(), wait) {
		t.Fatal("Done not closed after the lease expired")
	}
	t.Logf("lease expired %s after its keepalives stopped", time.Since(start).Round(time.Millisecond))
}

type result struct {
	l   state.Leadership
	err error
}

func campaign(ctx context.Context, st state.Store, s state.Session, name, cand string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		l, err := st.Campaign(ctx, s, name, cand)
		ch <- result{l, err}
	}()
	return ch
}

func won(t *testing.T, ch <-chan result, within time.Duration) state.Leadership {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.l
	case <-time.After(within):
		t.Fatal("candidate did not win")
	}
	panic("unreachable")
}

func blocked(t *testing.T, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("candidate returned (%v) while another leads", r.err)
	case <-time.After(300 * time.Millisecond):
	}
}

func testCampaign(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	s1 := must(st.NewSession(ctx, TTL))(t)
	s2 := must(st.NewSession(ctx, TTL))(t)
	l1 := won(t, campaign(ctx, st, s1, "deadlines", "server-1"), wait)
	c2 := campaign(ctx, st, s2, "deadlines", "server-2")
	blocked(t, c2)
	if err := l1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if !closed(l1.Done(), wait) {
		t.Fatal("Done not closed after Resign")
	}
	l2 := won(t, c2, wait)
	// Leadership ends with its session, and the next candidate wins.
	s3 := must(st.NewSession(ctx, TTL))(t)
	c3 := campaign(ctx, st, s3, "deadlines", "server-3")
	blocked(t, c3)
	if err := s2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !closed(l2.Done(), wait) {
		t.Fatal("Done not closed after the session closed")
	}
	l3 := won(t, c3, wait)
	// Another election is independent.
	won(t, campaign(ctx, st, s1, "other", "server-1"), wait)
	if err := l3.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}

func testCampaignFIFO(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	var ss []state.Session
	for range 3 {
		ss = append(ss, must(st.NewSession(ctx, TTL))(t))
	}
	la := won(t, campaign(ctx, st, ss[0], "fifo", "a"), wait)
	cb := campaign(ctx, st, ss[1], "fifo", "b")
	blocked(t, cb)
	cc := campaign(ctx, st, ss[2], "fifo", "c")
	blocked(t, cc)
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb := won(t, cb, wait)
	blocked(t, cc)
	if err := lb.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	won(t, cc, wait)
}

func testCampaignCancel(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	s1 := must(st.NewSession(ctx, TTL))(t)
	s2 := must(st.NewSession(ctx, TTL))(t)
	s3 := must(st.NewSession(ctx, TTL))(t)
	l1 := won(t, campaign(ctx, st, s1, "cancel", "a"), wait)
	cctx, cancel := context.WithCancel(ctx)
	c2 := campaign(cctx, st, s2, "cancel", "b")
	blocked(t, c2)
	cancel()
	select {
	case r := <-c2:
		if r.err == nil {
			t.Fatal("cancelled Campaign won")
		}
	case <-time.After(wait):
		t.Fatal("Campaign did not return after its ctx ended")
	}
	// The withdrawn candidate does not stand in the next one's way.
	c3 := campaign(ctx, st, s3, "cancel", "c")
	blocked(t, c3)
	if err := l1.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	won(t, c3, wait)
}

func testCASRace(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	const workers, each = 8, 5
	must(st.Create(ctx, "counter", []byte("0"), state.WriteOptions{}))(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	conflicts := 0
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range each {
				for {
					e, err := st.Get(ctx, "counter")
					if err != nil {
						errs <- err
						return
					}
					n, _ := strconv.Atoi(string(e.Value))
					_, err = st.Update(ctx, "counter", []byte(strconv.Itoa(n+1)), e.Revision, state.WriteOptions{})
					if err == nil {
						break
					}
					if !errors.Is(err, state.ErrConflict) {
						errs <- err
						return
					}
					mu.Lock()
					conflicts++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	e := must(st.Get(ctx, "counter"))(t)
	if got := string(e.Value); got != strconv.Itoa(workers*each) {
		t.Fatalf("counter = %s, want %d", got, workers*each)
	}
	t.Logf("%d increments, %d conflicts retried", workers*each, conflicts)
}

func testClosed(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	must(st.Put(ctx, "k", []byte("v"), state.WriteOptions{}))(t)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := st.Get(ctx, "k")
	wantErr(t, err, state.ErrClosed)
	_, err = st.Put(ctx, "k", []byte("v"), state.WriteOptions{})
	wantErr(t, err, state.ErrClosed)
	ev := next(t, st.Watch(ctx, "", 0))
	wantErr(t, ev.Err, state.ErrClosed)
}

// testEvict: a leader whose process died (its session no longer kept
// alive, its lease not yet expired) is evicted by name, and the next
// candidate wins at once instead of after the lease's TTL.
func testEvict(t *testing.T, st state.Store) {
	ctx := ctxT(t)
	deadCtx, die := context.WithCancel(ctx)
	dead := must(st.NewSession(deadCtx, TTL))(t)
	won(t, campaign(ctx, st, dead, "evict", "server-1"), wait)
	die() // keepalives stop; the lease lives on until its TTL
	next := must(st.NewSession(ctx, TTL))(t)
	c := campaign(ctx, st, next, "evict", "server-2")
	if err := st.Evict(ctx, "evict", "server-3"); err != nil {
		t.Fatal(err)
	}
	blocked(t, c) // evicting someone else changes nothing
	start := time.Now()
	if err := st.Evict(ctx, "evict", "server-1"); err != nil {
		t.Fatal(err)
	}
	l := won(t, c, TTL/2)
	t.Logf("next candidate won %s after the eviction", time.Since(start).Round(time.Millisecond))
	if err := l.Resign(ctx); err != nil {
		t.Fatal(err)
	}
}
