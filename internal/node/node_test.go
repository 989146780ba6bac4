package node

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/capacity"
	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
)

// TestCreateKill: a sandbox runs with what was asked (resources, envd's
// environment and token, its egress), is listed and recorded; a kill
// gives everything back.
func TestCreateKill(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(h.config())
	ctx := context.Background()
	sb, err := n.Create(ctx, CreateRequest{SandboxID: "sb1", TemplateID: "tiny-alias", CPUCount: 2, MemoryMB: 512,
		EnvVars: map[string]string{"A": "1"}, Secure: true})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb1" || sb.TemplateID != testTemplate || sb.CPUCount != 2 || sb.MemoryMB != 512 || sb.EnvdAccessToken == "" {
		t.Errorf("created %+v", sb)
	}
	spec := h.rt.specs["sb1"]
	if spec.CPUCount != 2 || spec.MemoryMB != 512 || spec.HostAddr != sb.Addr || spec.EnvdPort != EnvdPort || spec.Prestarted {
		t.Errorf("the runtime was given %+v", spec)
	}
	if n := h.rt.foregrounds("sb1"); n != 0 {
		t.Errorf("a fresh boot, never in the background, was foregrounded %d times", n)
	}
	init := h.rt.envdOf("sb1").lastInit()
	if init == nil || init.EnvVars["A"] != "1" || init.AccessToken != sb.EnvdAccessToken || init.DefaultUser != "user" {
		t.Errorf("envd's /init: %+v", init)
	}
	if got := n.List(); len(got) != 1 || got[0] != sb {
		t.Errorf("List = %v", got)
	}
	if _, err := os.Stat(n.recordPath("sb1")); err != nil {
		t.Errorf("no local record: %v", err)
	}
	if _, err := n.Create(ctx, CreateRequest{SandboxID: "sb1", TemplateID: testTemplate}); !errors.Is(err, ErrExists) {
		t.Errorf("a second create of sb1: %v, want ErrExists", err)
	}
	if u, err := n.Usage(ctx, "sb1"); err != nil || u.MemoryBytes != 64<<20 {
		t.Errorf("Usage = %+v, %v", u, err)
	}
	if err := n.Kill(ctx, "sb1"); err != nil {
		t.Fatal(err)
	}
	h.empty("after the kill")
	if len(n.List()) != 0 {
		t.Errorf("List after the kill = %v", n.List())
	}
	if err := n.Kill(ctx, "sb1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a second kill: %v, want ErrNotFound", err)
	}
	if logs, err := n.Logs("sb1"); err != nil || len(logs) < 2 {
		t.Errorf("the log of a killed sandbox: %v, %v; want its creation and its kill", logs, err)
	}
}

// TestCreateRollback: a create that fails at any step undoes exactly
// what it did: no slot, no root filesystem, no runtime sandbox, no record,
// and the id is free again.
func TestCreateRollback(t *testing.T) {
	for _, tc := range []struct {
		name    string
		breakIt func(h *host)
		want    error
	}{
		{"NoSlot", func(h *host) { h.net.set(func(f *fakeNetwork) { f.fail = true }) }, nil},
		{"NoRootFS", func(h *host) { h.rootfs.mu.Lock(); h.rootfs.fail = true; h.rootfs.mu.Unlock() }, nil},
		{"RuntimeFails", func(h *host) { h.rt.set(func(r *fakeRuntime) { r.failCreate = true }) }, nil},
		{"EnvdNeverReady", func(h *host) { h.rt.set(func(r *fakeRuntime) { r.noEnvd = true }) }, context.DeadlineExceeded},
		{"InitFails", func(h *host) { h.rt.set(func(r *fakeRuntime) { r.failInit = true }) }, nil},
		{"UnknownTemplate", func(h *host) {}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t)
			cfg := h.config()
			cfg.ReadyTimeout = 200 * time.Millisecond
			n, _ := h.start(cfg)
			ctx := context.Background()
			tc.breakIt(h)
			tpl := testTemplate
			if tc.name == "UnknownTemplate" {
				tpl = "nosuch"
			}
			_, err := n.Create(ctx, CreateRequest{SandboxID: "sb1", TemplateID: tpl})
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("create: %v, want an error (%v)", err, tc.want)
			}
			h.empty("after the failed create")
			if len(n.List()) != 0 {
				t.Errorf("List after the failed create = %v", n.List())
			}
			n.mu.Lock()
			pending := len(n.pending)
			n.mu.Unlock()
			if pending != 0 {
				t.Errorf("%d creates still pending", pending)
			}
			// Mended, the same id starts.
			h.net.set(func(f *fakeNetwork) { f.fail = false })
			h.rootfs.mu.Lock()
			h.rootfs.fail = false
			h.rootfs.mu.Unlock()
			h.rt.set(func(r *fakeRuntime) { r.failCreate, r.noEnvd, r.failInit = false, false, false })
			if _, err := n.Create(ctx, CreateRequest{SandboxID: "sb1", TemplateID: testTemplate}); err != nil {
				t.Fatalf("creating sb1 once mended: %v", err)
			}
		})
	}
}

// TestAdmission: the node refuses a sandbox past its capacity by the
// shared rule (package capacity), counting what its running, pending and
// prestarted sandboxes are configured with; a sandbox that can never fit
// is ErrTooLarge. A refusal holds nothing.
func TestAdmission(t *testing.T) {
	h := newHost(t)
	cfg := h.config()
	n, _ := h.start(cfg)
	ctx := context.Background()
	if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, MemoryMB: 2048}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("2 GiB on a node of 1: %v, want ErrTooLarge", err)
	}
	if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, CPUCount: 3}); !errors.Is(err, ErrTooLarge) {
		t.Errorf("3 CPUs on a node of 2: %v, want ErrTooLarge", err)
	}
	var made []string
	for i := 0; ; i++ {
		committed := n.Stats().CommittedMB
		want := cfg.Capacity.WithDefaults().Admit(capacity.Request{MemoryMB: 256, CPUs: 1}, capacity.Load{CommittedMB: committed, MemoryUsed: -1, DiskUsed: -1})
		sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate})
		if (err == nil) != (want == nil) {
			t.Fatalf("create %d with %d MiB committed: %v; the shared rule says %v", i, committed, err, want)
		}
		if err != nil {
			if !errors.Is(err, ErrNoCapacity) {
				t.Fatalf("create %d: %v, want ErrNoCapacity", i, err)
			}
			break
		}
		made = append(made, sb.ID)
	}
	if len(made) != 4 {
		t.Errorf("%d sandboxes of 256 MiB fit on 1 GiB without overcommit, want 4", len(made))
	}
	if got := h.net.heldCount(); got != len(made) {
		t.Errorf("%d slots held for %d sandboxes: the refusal kept one", got, len(made))
	}
	if err := n.Kill(ctx, made[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate}); err != nil {
		t.Errorf("a create once a sandbox is gone: %v", err)
	}
}

// TestWarmPool: the pool prestarts sandboxes (not listed as users', but
// committed), hands one to a create that fits with the create's
// environment and egress, refills, and a create it does not fit boots
// afresh; a prestarted sandbox that dies is not reported; Close kills
// them all.
func TestWarmPool(t *testing.T) {
	h := newHost(t)
	cfg := h.config()
	cfg.WarmPoolFloor, cfg.WarmTemplates, cfg.WarmPoolMemory = 2, []string{testTemplate}, 1<<30
	cfg.Capacity.MemoryMB = 4096
	n, _ := h.start(cfg)
	ctx := context.Background()
	exits := make(chan Exit, 16)
	n.OnExit(func(ex Exit) { exits <- ex })
	waitFor(t, func() bool { return len(n.pool.list()) == 2 }, "two prestarted sandboxes")
	if len(n.List()) != 0 {
		t.Errorf("prestarted sandboxes listed: %v", n.List())
	}
	if got := n.Stats().CommittedMB; got != 2*256 {
		t.Errorf("committed %d MiB with two prestarted sandboxes, want %d", got, 2*256)
	}
	prestarted := map[string]bool{}
	for _, sb := range n.pool.list() {
		prestarted[sb.ID] = true
	}
	creates := h.rt.createCount()
	sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, EnvVars: map[string]string{"B": "2"},
		Network: netns.SlotOptions{AllowInternet: false}})
	if err != nil {
		t.Fatal(err)
	}
	if !prestarted[sb.ID] {
		t.Errorf("create got %s, not one of the prestarted %v", sb.ID, prestarted)
	}
	if init := h.rt.envdOf(sb.ID).lastInit(); init == nil || init.EnvVars["B"] != "2" {
		t.Errorf("the prestarted sandbox's /init: %+v", init)
	}
	if eg := h.net.egressOf(sb.slot.Name); eg.AllowInternet {
		t.Errorf("the prestarted sandbox keeps the pool's open egress: %+v", eg)
	}
	waitFor(t, func() bool { return len(n.pool.list()) == 2 && h.rt.createCount() == creates+1 }, "the pool to refill")

	for _, req := range []CreateRequest{
		{SandboxID: "named", TemplateID: testTemplate},
		{TemplateID: testTemplate, MemoryMB: 128},
	} {
		before := h.rt.createCount()
		sb, err := n.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if prestarted[sb.ID] || h.rt.createCount() != before+1 {
			t.Errorf("a create of %+v took a prestarted sandbox (%s)", req, sb.ID)
		}
	}

	dead := n.pool.list()[0].ID
	h.rt.crash(dead, false)
	waitFor(t, func() bool {
		return !slices.ContainsFunc(n.pool.list(), func(sb *Sandbox) bool { return sb.ID == dead }) && len(n.pool.list()) == 2
	}, "the dead prestarted sandbox to be replaced")
	select {
	case ex := <-exits:
		t.Errorf("a prestarted sandbox's death was reported: %+v", ex)
	default:
	}

	// A prestarted sandbox the runtime cannot bring to the foreground is
	// not handed out behind the others: it goes, and the create boots.
	pooled := map[string]bool{}
	for _, sb := range n.pool.list() {
		pooled[sb.ID] = true
	}
	h.rt.set(func(r *fakeRuntime) { r.failForeground = true })
	sb, err = n.Create(ctx, CreateRequest{TemplateID: testTemplate})
	if err != nil {
		t.Fatalf("a create whose prestarted sandbox cannot be foregrounded: %v", err)
	}
	if pooled[sb.ID] || h.rt.foregrounds(sb.ID) != 0 {
		t.Errorf("got %s (pooled: %v), want a fresh boot", sb.ID, pooled[sb.ID])
	}
	for id := range pooled {
		if !slices.ContainsFunc(n.pool.list(), func(sb *Sandbox) bool { return sb.ID == id }) && h.rt.isRunning(id) {
			t.Errorf("the prestarted sandbox %s taken and not foregrounded still runs", id)
		}
	}
	h.rt.set(func(r *fakeRuntime) { r.failForeground = false })

	if err := n.Close(ctx, KillSandboxes); err != nil {
		t.Fatal(err)
	}
	h.empty("after Close")
}

// TestExit: a sandbox that dies on its own is cleaned up after and
// reported, an OOM kill as such.
func TestExit(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(h.config())
	ctx := context.Background()
	got := make(chan Exit, 1)
	n.OnExit(func(ex Exit) { got <- ex })
	sb, err := n.Create(ctx, CreateRequest{SandboxID: "oom", TemplateID: testTemplate})
	if err != nil {
		t.Fatal(err)
	}
	h.rt.crash(sb.ID, true)
	ex := <-got
	if ex.ID != "oom" || !ex.OutOfMemory || ex.Reason == "" {
		t.Errorf("reported %+v", ex)
	}
	h.empty("after the exit")
	if _, err := n.Get("oom"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after the exit: %v", err)
	}
}

// TestRecover: a restarted node takes over the sandboxes the earlier
// process recorded and whose envd answers, with their slots and tokens;
// it removes those without a record, those whose envd is dead, records
// without a sandbox, and slots nobody adopted.
func TestRecover(t *testing.T) {
	h := newHost(t)
	ctx := context.Background()
	first, _ := h.start(h.config())
	keep, err := first.Create(ctx, CreateRequest{SandboxID: "keep", TemplateID: testTemplate, Secure: true, MemoryMB: 512})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.Create(ctx, CreateRequest{SandboxID: "deadenvd", TemplateID: testTemplate}); err != nil {
		t.Fatal(err)
	}
	if _, err := first.Create(ctx, CreateRequest{SandboxID: "gone", TemplateID: testTemplate}); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(ctx, KeepSandboxes); err != nil {
		t.Fatal(err)
	}
	// While no node runs: one sandbox's envd dies, one sandbox dies
	// whole (its record stays), and a create cut short left a sandbox
	// without a record and a slot nobody will claim.
	h.rt.envdOf("deadenvd").stop()
	h.rt.set(func(r *fakeRuntime) {
		r.running["gone"].stop()
		delete(r.running, "gone")
	})
	if _, err := h.net.Acquire(ctx, netns.SlotOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Create(ctx, runtime.Spec{ID: "norecord", HostAddr: keep.Addr.Next().Next().Next().Next().Next()}); err != nil {
		t.Fatal(err)
	}
	h.net.restart()

	second, kept := h.start(h.config())
	if len(kept) != 1 || kept[0].ID != "keep" {
		t.Fatalf("kept %v, want keep", kept)
	}
	got, err := second.Get("keep")
	if err != nil {
		t.Fatal(err)
	}
	if got.EnvdAccessToken != keep.EnvdAccessToken || got.MemoryMB != 512 || got.Addr != keep.Addr || got.slot.Name != keep.slot.Name {
		t.Errorf("recovered %+v, was %+v", got, keep)
	}
	if ids := h.rt.ids(); !slices.Equal(ids, []string{"keep"}) {
		t.Errorf("the runtime runs %v after recovery, want [keep]", ids)
	}
	if n := h.net.heldCount(); n != 1 {
		t.Errorf("%d slots held after recovery, want keep's", n)
	}
	if got := second.Stats().CommittedMB; got != 512 {
		t.Errorf("committed %d MiB after recovery, want keep's 512", got)
	}
	if err := second.Kill(ctx, "keep"); err != nil {
		t.Fatalf("killing the recovered sandbox: %v", err)
	}
	h.empty("after the recovered sandbox's kill")
}

// TestBootsTakeTurns: with MaxBoots 2, five creates at once boot two at
// a time, the others waiting their turn; one whose caller gives up while
// it waits leaves nothing behind (no memory counted, no network held),
// and the rest still boot.
func TestBootsTakeTurns(t *testing.T) {
	h := newHost(t)
	cfg := h.config()
	cfg.MaxBoots, cfg.Capacity.MemoryMB = 2, 16*256
	n, _ := h.start(cfg)
	gate := make(chan struct{})
	h.rt.set(func(r *fakeRuntime) { r.gate = gate })
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	for range 4 {
		wg.Go(func() {
			_, err := n.Create(context.Background(), CreateRequest{TemplateID: testTemplate})
			errs <- err
		})
	}
	waitFor(t, func() bool { h.rt.mu.Lock(); defer h.rt.mu.Unlock(); return h.rt.inFlight == 2 }, "two boots")
	waitFor(t, func() bool { n.mu.Lock(); defer n.mu.Unlock(); return len(n.pending) == 4 }, "the others to wait their turn")
	held := h.net.heldCount()

	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate})
		gaveUp <- err
	}()
	waitFor(t, func() bool { n.mu.Lock(); defer n.mu.Unlock(); return len(n.pending) == 5 }, "a fifth create to wait")
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "turn to boot") {
		t.Fatalf("a create given up while waiting: %v", err)
	}
	n.mu.Lock()
	pending := len(n.pending)
	n.mu.Unlock()
	if pending != 4 || h.net.heldCount() != held {
		t.Errorf("after it: %d pending (want 4), %d network slots held (want %d)", pending, h.net.heldCount(), held)
	}

	h.rt.set(func(r *fakeRuntime) { r.gate = nil })
	close(gate)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	h.rt.mu.Lock()
	most := h.rt.maxInFlight
	h.rt.mu.Unlock()
	if most != 2 || h.rt.createCount() != 4 {
		t.Errorf("%d boots at once (want 2), %d created (want 4)", most, h.rt.createCount())
	}
}
