package node

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/testutil"
)

// poolConfig is h's node with a warm pool of budget bytes, floor
// prestarted sandboxes of the test template, and room for 16 sandboxes.
func poolConfig(h *host, budget int64, floor int) Config {
	cfg := h.config()
	cfg.WarmPoolMemory, cfg.WarmPoolFloor, cfg.WarmTemplates = budget, floor, []string{testTemplate}
	cfg.Capacity.MemoryMB = 16 * 256
	return cfg
}

func poolReady(n *Node) int { return len(n.pool.list()) }

func poolStatus(t *testing.T, n *Node, key PoolKey) PoolStatus {
	t.Helper()
	for _, st := range n.WarmPool().Keys {
		if st.Key == key {
			return st
		}
	}
	return PoolStatus{Key: key}
}

// createAtOnce starts count creates of the test template at once and
// returns a wait for their ends.
func createAtOnce(t *testing.T, n *Node, count int) (wait func()) {
	var wg sync.WaitGroup
	for range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.Create(context.Background(), CreateRequest{TemplateID: testTemplate}); err != nil {
				t.Error(err)
			}
		}()
	}
	return wg.Wait
}

// TestWarmPoolFollowsDemand: a template without a floor has no pool until
// creates come; a burst of creates sizes its pool to the burst, so that
// the next burst is served warm; once nobody has created it for the
// window, its pool goes.
func TestWarmPoolFollowsDemand(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(poolConfig(h, 1<<30, 0))
	ctx := context.Background()
	key := PoolKey{TemplateID: testTemplate}
	n.pool.poke()
	time.Sleep(100 * time.Millisecond)
	if got := h.rt.createCount(); got != 0 {
		t.Fatalf("%d sandboxes prestarted without demand or floor", got)
	}

	// Three creates at once, held in the runtime until all three boot.
	gate := make(chan struct{})
	h.rt.set(func(r *fakeRuntime) { r.gate = gate })
	wait := createAtOnce(t, n, 3)
	waitFor(t, func() bool { h.rt.mu.Lock(); defer h.rt.mu.Unlock(); return h.rt.inFlight == 3 }, "the burst to boot")
	h.rt.set(func(r *fakeRuntime) { r.gate = nil })
	close(gate)
	wait()
	if st := poolStatus(t, n, key); st.Served.Cold != 3 || st.Served.Warm != 0 || st.Peak != 3 {
		t.Errorf("after a cold burst of 3: %+v", st)
	}
	waitFor(t, func() bool { return poolReady(n) == 3 }, "the pool to grow to the burst")

	h.clock.advance(time.Minute)
	prestarted := map[string]bool{}
	for _, sb := range n.pool.list() {
		prestarted[sb.ID] = true
	}
	for range 3 {
		sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate})
		if err != nil {
			t.Fatal(err)
		}
		if !prestarted[sb.ID] {
			t.Errorf("the second burst booted %s instead of taking a prestarted one", sb.ID)
		}
	}
	if st := poolStatus(t, n, key); st.Served.Warm != 3 || st.Peak != 3 || st.Target != 3 {
		t.Errorf("after a warm burst of 3: %+v", st)
	}
	waitFor(t, func() bool { return poolReady(n) == 3 }, "the pool to refill")

	// Nobody creates it for the window: its pool is killed, the users'
	// sandboxes stay.
	h.clock.advance(demandWindow)
	n.pool.poke()
	waitFor(t, func() bool { return poolReady(n) == 0 }, "the unused template's pool to go")
	if got := len(h.rt.ids()); got != 6 {
		t.Errorf("the runtime runs %d sandboxes, want the 6 created", got)
	}
	if st := poolStatus(t, n, key); st.Target != 0 || st.Peak != 0 {
		t.Errorf("the unused template's pool: %+v", st)
	}
}

// linesWith are the lines of log that contain s.
func linesWith(log string, s string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// TestWarmPoolSaysWhenTheBudgetIsShort: a burst of 3 teaches a pool whose
// budget holds 2 (the fake's sandboxes take 64 MiB): the node says so
// once, with the figures, not at every sizing after.
func TestWarmPoolSaysWhenTheBudgetIsShort(t *testing.T) {
	h := newHost(t)
	cfg := poolConfig(h, 150<<20, 0)
	var log testutil.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	n, _ := h.start(cfg)
	createAtOnce(t, n, 3)()
	waitFor(t, func() bool { return poolReady(n) == 2 }, "the pool to fill its budget")
	for range 5 {
		n.pool.poke()
		time.Sleep(20 * time.Millisecond)
	}
	const msg = "budget holds fewer prestarted sandboxes than their demand"
	got := linesWith(log.String(), msg)
	if len(got) != 1 {
		t.Fatalf("%d lines say the budget is short, want 1:\n%s", len(got), strings.Join(got, "\n"))
	}
	for _, want := range []string{"target=2", "demand=3", "budget_mb=150", "each_mb=64"} {
		if !strings.Contains(got[0], want) {
			t.Errorf("the line lacks %s: %s", want, got[0])
		}
	}
	if st := poolStatus(t, n, PoolKey{TemplateID: testTemplate}); st.Target != 2 {
		t.Errorf("the pool's target is %d, want 2", st.Target)
	}
}

// TestWarmPoolRefillPace: the refill boots one sandbox at a time, none
// while a create is booting, none while the host's CPUs are busy, and
// none while its memory is near the high-water mark.
func TestWarmPoolRefillPace(t *testing.T) {
	h := newHost(t)
	cfg := poolConfig(h, 1<<30, 3)
	cfg.Capacity.MemoryHighWater = 0.9
	gate := make(chan struct{})
	h.rt.set(func(r *fakeRuntime) { r.gate = gate })
	n, _ := h.start(cfg)
	ctx := context.Background()
	waitFor(t, func() bool { h.rt.mu.Lock(); defer h.rt.mu.Unlock(); return h.rt.inFlight == 1 }, "the first refill boot")
	time.Sleep(100 * time.Millisecond)
	h.rt.set(func(r *fakeRuntime) { r.gate = nil })
	close(gate)
	waitFor(t, func() bool { return poolReady(n) == 3 }, "the pool to fill")
	h.rt.mu.Lock()
	most := h.rt.maxInFlight
	h.rt.mu.Unlock()
	if most != 1 {
		t.Errorf("%d refill boots at once, want 1", most)
	}

	// A create that boots holds the refill until it is done.
	gate = make(chan struct{})
	h.rt.set(func(r *fakeRuntime) { r.gate = gate })
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, MemoryMB: 128}); err != nil {
			t.Errorf("the booting create: %v", err)
		}
	}()
	waitFor(t, func() bool { h.rt.mu.Lock(); defer h.rt.mu.Unlock(); return h.rt.inFlight == 1 }, "the create to boot")
	if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate}); err != nil { // takes one: the pool is short
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a tick and more
	h.rt.mu.Lock()
	inFlight := h.rt.inFlight
	h.rt.mu.Unlock()
	if inFlight != 1 || poolReady(n) != 2 {
		t.Errorf("while a create boots: %d boots under way, %d prestarted; want the create's only, and 2", inFlight, poolReady(n))
	}
	h.rt.set(func(r *fakeRuntime) { r.gate = nil })
	close(gate)
	wg.Wait()
	waitFor(t, func() bool { return poolReady(n) == 3 }, "the refill once the create is done")

	for _, tc := range []struct {
		what string
		busy func(l *fakeLoad)
	}{
		{"the CPUs are busy", func(l *fakeLoad) { l.busy = 0.95 }},
		{"memory is near the high-water mark", func(l *fakeLoad) { l.used = 0.88 }},
	} {
		h.load.set(tc.busy)
		creates := h.rt.createCount()
		if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate}); err != nil {
			t.Fatal(err)
		}
		h.load.set(func(l *fakeLoad) { l.cpuReads = 0 })
		time.Sleep(1500 * time.Millisecond)
		h.load.mu.Lock()
		looked := h.load.cpuReads
		h.load.mu.Unlock()
		if looked == 0 {
			t.Fatalf("while %s: the pool did not look in %v", tc.what, 1500*time.Millisecond)
		}
		if got := h.rt.createCount(); got != creates || poolReady(n) != 2 {
			t.Errorf("while %s: %d boots, %d prestarted; want none, and 2", tc.what, got-creates, poolReady(n))
		}
		h.load.set(func(l *fakeLoad) { l.busy, l.used = 0.1, 0.1 })
		waitFor(t, func() bool { return poolReady(n) == 3 }, "the refill once "+tc.what+" no more")
	}
}

// TestWarmPoolShrinksUnderPressure: with the host's memory past the
// high-water mark the pool gives back what the host is short of, floors
// included, and refills once it is not.
func TestWarmPoolShrinksUnderPressure(t *testing.T) {
	h := newHost(t)
	cfg := poolConfig(h, 1<<30, 3)
	cfg.Capacity.MemoryHighWater = 0.9
	// The host has 4 GiB, and each fake sandbox takes 64 MiB (1/64 of it)
	// beside what the test says the rest of the host uses.
	h.load.set(func(l *fakeLoad) {
		l.total = 4 << 30
		l.perSandbox = func() float64 { return float64(len(h.rt.ids())) / 64 }
	})
	n, _ := h.start(cfg)
	waitFor(t, func() bool { return poolReady(n) == 3 }, "the floor")
	// At 88% and three sandboxes' 4.7%, the host is 110 MiB past the
	// 90% mark: the pool keeps what fits in the 82 MiB it may still
	// hold (one), and then, at 89.6%, holds on without refilling.
	h.load.set(func(l *fakeLoad) { l.used = 0.88 })
	waitFor(t, func() bool { return poolReady(n) == 1 }, "the pool to shrink to one")
	time.Sleep(1200 * time.Millisecond)
	if got := poolReady(n); got != 1 {
		t.Errorf("%d prestarted after more ticks at 89.6%%, want 1", got)
	}
	h.load.set(func(l *fakeLoad) { l.used = 0.95 })
	waitFor(t, func() bool { return poolReady(n) == 0 }, "the pool to empty")
	// The pool lets go of its surplus before it kills it.
	waitFor(t, func() bool { return len(h.rt.ids()) == 0 }, "the runtime to run nothing")
	h.load.set(func(l *fakeLoad) { l.used = 0.5 })
	waitFor(t, func() bool { return poolReady(n) == 3 }, "the refill once the pressure is gone")
}

// TestWarmPoolAdmission: prestarted sandboxes count toward the node's
// admission and its reports; a create that does not fit beside them
// kills as many as it needs, and one that would not fit without them
// either kills none.
func TestWarmPoolAdmission(t *testing.T) {
	h := newHost(t)
	cfg := poolConfig(h, 1<<30, 2)
	cfg.Capacity.MemoryMB = 1024 // four sandboxes of 256 MiB, no overcommit
	n, _ := h.start(cfg)
	ctx := context.Background()
	waitFor(t, func() bool { return poolReady(n) == 2 }, "the floor")
	if st := n.Stats(); st.CommittedMB != 512 || st.Pooled != 2 || st.Sandboxes != 0 {
		t.Errorf("with two prestarted: %+v", st)
	}
	var users []string
	for range 2 {
		sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate})
		if err != nil {
			t.Fatal(err)
		}
		users = append(users, sb.ID)
	}
	waitFor(t, func() bool { return poolReady(n) == 2 }, "the refill")
	// Four sandboxes of one vCPU each: the pool's count as the users' do.
	if st := n.Stats(); st.CommittedMB != 1024 || st.CommittedCPUs != 4 || st.Pooled != 2 || st.Sandboxes != 2 {
		t.Errorf("full with two users' and two prestarted: %+v", st)
	}
	// Another size: not a prestarted one's; it fits by killing one.
	sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, CPUCount: 2})
	if err != nil {
		t.Fatalf("a create that fits once a prestarted sandbox goes: %v", err)
	}
	users = append(users, sb.ID)
	if got := poolReady(n); got != 1 {
		t.Errorf("%d prestarted after the create that needed room, want 1", got)
	}
	if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, MemoryMB: 512}); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("512 MiB with 256 held by the pool: %v, want ErrNoCapacity", err)
	}
	if got := poolReady(n); got != 1 {
		t.Errorf("%d prestarted after a create that could not fit anyway, want 1 (none killed for nothing)", got)
	}
	time.Sleep(1200 * time.Millisecond)
	if got, st := poolReady(n), n.Stats(); got != 1 || st.CommittedMB != 1024 {
		t.Errorf("the full node's pool: %d prestarted, %d MiB committed; want 1 and 1024 (the refill admitted as any boot)", got, st.CommittedMB)
	}
	if err := n.Kill(ctx, users[0]); err != nil {
		t.Fatal(err)
	}
	h.clock.advance(poolRetry) // the refill refused waits that long
	waitFor(t, func() bool { return poolReady(n) == 2 }, "the refill once there is room")
	if !slices.Contains(h.rt.ids(), users[1]) || !slices.Contains(h.rt.ids(), users[2]) {
		t.Errorf("a user's sandbox was killed for the pool: the runtime runs %v", h.rt.ids())
	}
}

// TestWarmPoolClosedKeepingSandboxes: a node closed keeping its
// sandboxes for the next process still kills its prestarted ones: a pool
// is a cache, and nothing would take them over.
func TestWarmPoolClosedKeepingSandboxes(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(poolConfig(h, 1<<30, 2))
	ctx := context.Background()
	waitFor(t, func() bool { return poolReady(n) == 2 }, "the floor")
	sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return poolReady(n) == 2 }, "the refill")
	if err := n.Close(ctx, KeepSandboxes); err != nil {
		t.Fatal(err)
	}
	if ids := h.rt.ids(); !slices.Equal(ids, []string{sb.ID}) {
		t.Errorf("after a close that keeps sandboxes the runtime runs %v, want the user's %s only", ids, sb.ID)
	}
	if got := h.net.heldCount(); got != 1 {
		t.Errorf("%d slots held, want the user's", got)
	}
}

// TestPoolChangeReported: OnPoolChange hears when a template's pool runs
// out and when it holds a sandbox again (what the cluster schedules by),
// not every take and refill.
func TestPoolChangeReported(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(poolConfig(h, 1<<30, 2))
	waitFor(t, func() bool { return poolReady(n) == 2 }, "the pool to fill to its floor")
	var changes atomic.Int32
	n.OnPoolChange(func() { changes.Add(1) })

	// The refill's boots wait until both takes are done.
	gate := make(chan struct{})
	h.rt.set(func(r *fakeRuntime) { r.gate = gate })
	ctx := context.Background()
	for i := range 2 {
		if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate}); err != nil {
			t.Fatal(err)
		}
		if got, want := changes.Load(), int32(i); got != want {
			t.Errorf("after take %d: %d changes reported, want %d", i+1, got, want)
		}
	}
	h.rt.set(func(r *fakeRuntime) { r.gate = nil })
	close(gate)
	waitFor(t, func() bool { return poolReady(n) == 2 }, "the pool to refill")
	if got := changes.Load(); got != 2 {
		t.Errorf("%d changes reported after the pool ran out and refilled to 2, want 2", got)
	}
}

// TestStuckBootsReported: a boot that has counted as in progress for
// longer than any boot takes (which holds every pool's refill back) is
// reported, once; a recent one is not.
func TestStuckBootsReported(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(poolConfig(h, 0, 0))
	now := time.Now()
	n.mu.Lock()
	n.pending["old"] = pendingBoot{mb: 1, since: now.Add(-stuckBootAfter - time.Second)}
	n.pending["new"] = pendingBoot{mb: 1, since: now.Add(-time.Second)}
	n.mu.Unlock()
	defer func() { n.unpend("old"); n.unpend("new") }()
	if got := n.stuckBoots(now); !slices.Equal(got, []string{"old"}) {
		t.Errorf("stuck boots %v, want [old]", got)
	}
	if got := n.stuckBoots(now.Add(time.Minute)); len(got) != 0 {
		t.Errorf("reported again: %v", got)
	}
}

// TestWarmPoolInitialisesAhead: a prestarted sandbox gets its /init (the
// template's environment and a token) while it waits; a create that adds
// nothing hands it out without one, a create with variables or without a
// token sends its own.
func TestWarmPoolInitialisesAhead(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(poolConfig(h, 1<<30, 3))
	ctx := context.Background()
	waitFor(t, func() bool { return poolReady(n) == 3 }, "three prestarted sandboxes")
	waitFor(t, func() bool {
		for _, sb := range n.pool.list() {
			if init := h.rt.envdOf(sb.ID).lastInit(); init == nil || init.AccessToken == "" {
				return false
			}
		}
		return true
	}, "every prestarted sandbox to be initialised with a token")

	// Each ran one command as the SDKs do, before its /init: its first
	// command's paths through envd are warm (warmFirstCommand).
	for _, sb := range n.pool.list() {
		if got, want := h.rt.envdOf(sb.ID).history(), []string{"start /bin/bash -l -c true", "init"}; !slices.Equal(got, want) {
			t.Errorf("prestarted %s: envd was asked %q, want %q", sb.ID, got, want)
		}
		// Its runtime may keep what the boot warmed until the handout,
		// and run it behind the sandboxes in use.
		if !h.rt.spec(sb.rt()).Prestarted {
			t.Errorf("prestarted %s was booted with a spec not marked prestarted", sb.ID)
		}
		if n := h.rt.foregrounds(sb.rt()); n != 0 {
			t.Errorf("prestarted %s was foregrounded %d times before its handout", sb.ID, n)
		}
	}

	for _, tc := range []struct {
		name      string
		req       CreateRequest
		newInit   bool
		wantToken bool
	}{
		{"secure, nothing added", CreateRequest{TemplateID: testTemplate, Secure: true}, false, true},
		{"secure, with variables", CreateRequest{TemplateID: testTemplate, Secure: true, EnvVars: map[string]string{"V": "1"}}, true, true},
		{"without a token", CreateRequest{TemplateID: testTemplate}, true, false},
	} {
		waitFor(t, func() bool { return poolReady(n) == 3 }, "the pool to refill")
		pooled := map[string]*initRequest{}
		for _, sb := range n.pool.list() {
			pooled[sb.ID] = h.rt.envdOf(sb.ID).lastInit()
		}
		sb, err := n.Create(ctx, tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		before, ok := pooled[sb.ID]
		if !ok {
			t.Fatalf("%s: got %s, not a prestarted sandbox", tc.name, sb.ID)
		}
		if n := h.rt.foregrounds(sb.rt()); n != 1 {
			t.Errorf("%s: handed out foregrounded %d times, want once", tc.name, n)
		}
		after := h.rt.envdOf(sb.ID).lastInit()
		if (after != before) != tc.newInit {
			t.Errorf("%s: a new /init at the handout: %v, want %v", tc.name, after != before, tc.newInit)
		}
		if (sb.EnvdAccessToken != "") != tc.wantToken {
			t.Errorf("%s: token %q", tc.name, sb.EnvdAccessToken)
		}
		switch {
		case !tc.newInit:
			if sb.EnvdAccessToken != before.AccessToken {
				t.Errorf("%s: handed out with token %q, envd holds %q", tc.name, sb.EnvdAccessToken, before.AccessToken)
			}
		case tc.wantToken:
			if after.AccessToken != before.AccessToken || after.EnvVars["V"] != "1" || after.DropAccessToken {
				t.Errorf("%s: /init %+v after %+v", tc.name, after, before)
			}
		default:
			if !after.DropAccessToken || after.AccessToken != "" {
				t.Errorf("%s: /init %+v does not drop the pool's token", tc.name, after)
			}
		}
	}
	if err := n.Close(ctx, KillSandboxes); err != nil {
		t.Fatal(err)
	}
}

// TestWarmPoolRefillWaitsAfterTake: the refill does not boot beside a
// taken sandbox's first moments (its user's first command).
func TestWarmPoolRefillWaitsAfterTake(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(poolConfig(h, 1<<30, 1))
	ctx := context.Background()
	waitFor(t, func() bool { return poolReady(n) == 1 }, "a prestarted sandbox")
	n.pool.mu.Lock()
	n.pool.holdFor = time.Second
	n.pool.mu.Unlock()
	creates := h.rt.createCount()
	start := time.Now()
	if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, Secure: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if got := h.rt.createCount(); got != creates && time.Since(start) < time.Second {
		t.Fatalf("the refill booted %d sandboxes within 300 ms of a take", got-creates)
	}
	waitFor(t, func() bool { return poolReady(n) == 1 }, "the pool to refill after the hold")
	if held := time.Since(start); held < time.Second {
		t.Errorf("refilled %v after the take, within the hold", held)
	}
	if err := n.Close(ctx, KillSandboxes); err != nil {
		t.Fatal(err)
	}
}

// TestWarmPoolRefillWaitsForALull: while the pool keeps a reserve (a
// quarter of its target), the refill waits until creates pause for the
// lull, however long they keep coming; a create that takes the pool below
// the reserve cuts the wait to the short hold.
func TestWarmPoolRefillWaitsForALull(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(poolConfig(h, 1<<30, 8))
	ctx := context.Background()
	waitFor(t, func() bool { return poolReady(n) == 8 }, "8 prestarted sandboxes")
	const lull = time.Second
	n.pool.mu.Lock()
	n.pool.holdFor, n.pool.lullFor = 100*time.Millisecond, lull
	n.pool.mu.Unlock()
	create := func() time.Time {
		t.Helper()
		if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, Secure: true}); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	creates := h.rt.createCount()
	// Four creates 300 ms apart, 1.2 s in all, each leaving 4 or more of
	// 8 (reserve 2).
	var last time.Time
	for i := range 4 {
		if i > 0 {
			time.Sleep(300 * time.Millisecond)
		}
		last = create()
	}
	if got := h.rt.createCount(); got != creates {
		t.Fatalf("the refill booted %d sandboxes during a stream of creates, the pool above its reserve", got-creates)
	}
	waitFor(t, func() bool { return poolReady(n) == 8 }, "the pool to refill once creates paused")
	if waited := time.Since(last); waited < lull {
		t.Errorf("refilled %v after the last create of a stream, within the lull", waited)
	}

	// Below the reserve: 7 takes leave 1 of 8.
	n.pool.mu.Lock()
	n.pool.lullFor = time.Minute
	n.pool.mu.Unlock()
	creates = h.rt.createCount()
	for range 7 {
		create()
	}
	// Within waitFor's 5 s, not the minute's lull.
	waitFor(t, func() bool { return h.rt.createCount() > creates }, "the refill to boot below the reserve")
	if err := n.Close(ctx, KillSandboxes); err != nil {
		t.Fatal(err)
	}
}
