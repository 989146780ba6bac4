package cluster

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/state"
)

// remoteFleet opens a pure API cluster (no local node) over the given
// fake nodes, each registered at "addr-<id>" as a node agent would be.
func remoteFleet(t *testing.T, st state.Store, nodes ...*nodetest.Fake) (*Cluster, map[string]*membership.Registration) {
	t.Helper()
	ctx := context.Background()
	byAddr := map[string]*nodetest.Fake{}
	regs := map[string]*membership.Registration{}
	for _, n := range nodes {
		byAddr["addr-"+n.ID()] = n
		reg, err := membership.RegisterNode(ctx, st, membership.Reporter(n, "addr-"+n.ID()), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		regs[n.ID()] = reg
		t.Cleanup(reg.Stop)
	}
	c, err := Open(ctx, Config{State: st, Candidate: "api", TickInterval: 20 * time.Millisecond,
		Dial: func(id, addr string) nodeapi.Node { return byAddr[addr] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx, StopKeep) })
	waitFor(t, func() bool {
		_, err := c.nodes.place(placement{})
		c.nodes.mu.Lock()
		defer c.nodes.mu.Unlock()
		return err == nil && len(c.nodes.members) == len(nodes)
	}, "the nodes to be seen")
	return c, regs
}

// TestPlacement: creates spread over every node; a node that turns out to
// be full hands the create to another; a sandbox larger than every node is
// ErrInvalid, one that fits nowhere now or only on draining nodes is
// ErrNoCapacity saying why; each record names its node, and the proxy's
// route goes through it.
func TestPlacement(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	n1, n2, n3 := nodetest.NewFake("n1"), nodetest.NewFake("n2"), nodetest.NewFake("n3")
	c, _ := remoteFleet(t, st, n1, n2, n3)

	per := map[string]int{}
	for range 30 {
		sb := create(t, c, time.Hour)
		per[sb.NodeID]++
		if !n1.IsRunning(sb.ID) && !n2.IsRunning(sb.ID) && !n3.IsRunning(sb.ID) {
			t.Fatalf("sandbox %s runs on no node", sb.ID)
		}
		rt, err := c.Route(ctx, sb.ID)
		if err != nil || rt.Via != "addr-"+sb.NodeID {
			t.Fatalf("route of a sandbox on %s: %+v, %v", sb.NodeID, rt, err)
		}
	}
	for _, id := range []string{"n1", "n2", "n3"} {
		if per[id] == 0 {
			t.Fatalf("no sandbox placed on %s: %v", id, per)
		}
	}

	n1.SetFull(true)
	for range 10 {
		if sb := create(t, c, time.Hour); sb.NodeID == "n1" {
			t.Fatal("placed on a node that refuses")
		}
	}

	_, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute, MemoryMB: 8192}, TemplateID: "base"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "larger than every node") {
		t.Fatalf("a sandbox larger than every node: %v, want ErrInvalid saying so", err)
	}
	if _, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute}, TemplateID: "nosuch"}); !errors.Is(err, ErrTemplateNotFound) {
		t.Fatalf("unknown template: %v, want ErrTemplateNotFound", err)
	}
	for _, id := range []string{"n2", "n3"} {
		if _, err := c.SetDraining(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	_, err = c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute}, TemplateID: "base"})
	if !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("only a full node left: %v, want ErrNoCapacity", err)
	}
	n1.SetFull(false)
	if sb := create(t, c, time.Hour); sb.NodeID != "n1" {
		t.Fatalf("with the others draining, placed on %s", sb.NodeID)
	}
	if _, err := c.SetDraining(ctx, "n1", true); err != nil {
		t.Fatal(err)
	}
	if _, err = c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute}, TemplateID: "base"}); !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("every node draining: %v, want ErrNoCapacity saying so", err)
	}
}

// TestPlacementPrefersWarm: creates go to the node whose warm pool holds
// their template prestarted, as many as it holds, before its next report
// says so; then by headroom again.
func TestPlacementPrefersWarm(t *testing.T) {
	st := state.NewMemory()
	n1, n2, n3 := nodetest.NewFake("n1"), nodetest.NewFake("n2"), nodetest.NewFake("n3")
	n2.SetPooled(4)
	c, _ := remoteFleet(t, st, n1, n2, n3)
	c.nodes.mu.Lock()
	before := c.nodes.members["n2"].placedMB
	c.nodes.mu.Unlock()
	for i := range 4 {
		if sb := create(t, c, time.Hour); sb.NodeID != "n2" {
			t.Fatalf("create %d: placed on %s, want n2, which holds base prestarted", i, sb.NodeID)
		}
	}
	c.nodes.mu.Lock()
	var left map[string]int
	for _, n := range c.nodes.candidatesLocked() {
		if n.ID == "n2" {
			left = n.Pooled
		}
	}
	placed := c.nodes.members["n2"].placedMB
	c.nodes.mu.Unlock()
	if len(left) != 0 {
		t.Errorf("n2's pool as placement sees it after four creates: %v, want none left", left)
	}
	// The prestarted sandboxes they took are in n2's commitment already.
	if placed != before {
		t.Errorf("four creates from n2's pool counted %d MiB more on it, want none", placed-before)
	}
	per := map[string]int{}
	for range 12 {
		per[create(t, c, time.Hour).NodeID]++
	}
	if per["n1"] == 0 || per["n3"] == 0 {
		t.Errorf("creates once n2's pool is taken: %v, want them spread", per)
	}
}

// TestPlacementPrefersPrepared: a resume that cannot go back to the node
// it was paused on goes where a sandbox is prepared for its template, as
// long as one is left there.
func TestPlacementPrefersPrepared(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	n1, n2, n3 := nodetest.NewFake("n1"), nodetest.NewFake("n2"), nodetest.NewFake("n3")
	n3.SetPrepared(3)
	c, _ := remoteFleet(t, st, n1, n2, n3)
	for _, id := range []string{"n2", "n3"} {
		if _, err := c.SetDraining(ctx, id, true); err != nil {
			t.Fatal(err)
		}
	}
	var paused []*Sandbox
	for range 6 {
		sb := create(t, c, time.Hour)
		if err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		paused = append(paused, sb)
	}
	for id, drain := range map[string]bool{"n1": true, "n2": false, "n3": false} {
		if _, err := c.SetDraining(ctx, id, drain); err != nil {
			t.Fatal(err)
		}
	}
	per := map[string]int{}
	for i, sb := range paused {
		got, _, err := c.Connect(ctx, sb.ID, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if i < 3 && got.NodeID != "n3" {
			t.Fatalf("resume %d: on %s, want n3, which holds a sandbox prepared for base", i, got.NodeID)
		}
		per[got.NodeID]++
	}
	if per["n2"] == 0 {
		t.Errorf("resumes once n3's prepared sandboxes are taken: %v, want some on n2", per)
	}
}

// TestNodeLost: when a node's lease goes, its running sandboxes are
// reported lost (404 with the reason) and its paused ones resume on
// another node; a sandbox that exits on its own is forgotten with the
// node's reason; a node that comes back without a record of a sandbox it
// runs has it removed.
func TestNodeLost(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	nodes := nodetest.NewFakes("n1", "n2")
	n1, n2 := nodes[0], nodes[1]
	c, regs := remoteFleet(t, st, n1, n2)
	if _, err := c.SetDraining(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	running, paused, exits := create(t, c, time.Hour), create(t, c, time.Hour), create(t, c, time.Hour)
	if running.NodeID != "n1" || paused.NodeID != "n1" {
		t.Fatalf("placed on %s and %s, want n1", running.NodeID, paused.NodeID)
	}
	if err := c.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	// The server's sync with the node (its first event) must come
	// first: a sync that lists the node after the exit reports the
	// sandbox lost, which is what it would be, not why it ended.
	waitFor(t, func() bool { return n1.Lists() > 0 }, "the server to sync with node n1")
	n1.Exit(exits.ID, "killed: out of memory (memoryMB=512)")
	waitFor(t, func() bool {
		_, err := c.Get(ctx, exits.ID)
		return err != nil && strings.Contains(err.Error(), "out of memory")
	}, "the exited sandbox to be forgotten with its reason")

	if _, err := c.SetDraining(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}
	regs["n1"].Stop()
	if err := membership.DeregisterNode(ctx, st, "n1"); err != nil { // as its lease expiring does
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, err := c.Get(ctx, running.ID)
		return errors.Is(err, ErrNotFound) && strings.Contains(err.Error(), "node n1")
	}, "the lost node's sandbox to be reported lost")
	if l := c.List(ListFilter{States: []State{StateRunning}}); len(l) != 0 {
		t.Fatalf("lost sandboxes still listed: %d", len(l))
	}
	// Its paused sandbox's state is in the store: another node resumes it.
	sb, resumed, err := c.Connect(ctx, paused.ID, time.Minute)
	if err != nil || !resumed || sb.NodeID != "n2" || !n2.IsRunning(paused.ID) {
		t.Fatalf("resuming the lost node's paused sandbox: %+v %v %v", sb, resumed, err)
	}
}

// TestMigrate: a running sandbox moves to another node under the same id,
// keeping its deadline; a move to itself or to an unknown node is refused
// before anything stops; a move whose restore fails there leaves the
// sandbox running where it was.
func TestMigrate(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	nodes := nodetest.NewFakes("n1", "n2")
	n1, n2 := nodes[0], nodes[1]
	c, _ := remoteFleet(t, st, n1, n2)
	if _, err := c.SetDraining(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	sb := create(t, c, time.Hour)
	if _, err := c.SetDraining(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Migrate(ctx, sb.ID, "n1"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("migrating to its own node: %v, want ErrInvalid", err)
	}
	if _, err := c.Migrate(ctx, sb.ID, "nosuch"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("migrating to an unknown node: %v, want ErrNotFound", err)
	}
	if !n1.IsRunning(sb.ID) {
		t.Fatal("a refused migration stopped the sandbox")
	}
	m, err := c.Migrate(ctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	if m.Sandbox.ID != sb.ID || m.Sandbox.NodeID != "n2" || m.From != "n1" || !m.Sandbox.EndAt.Equal(sb.EndAt) {
		t.Fatalf("migration: %+v (was %+v)", m.Sandbox, sb)
	}
	if n1.IsRunning(sb.ID) || !n2.IsRunning(sb.ID) {
		t.Fatal("the sandbox did not move")
	}
	if got, _ := c.Get(ctx, sb.ID); got.NodeID != "n2" || got.State != StateRunning {
		t.Fatalf("record after the move: %+v", got)
	}
	// The move's snapshot does not outlive it.
	waitFor(t, func() bool { return n1.SnapshotCount() == 0 }, "the migration's snapshot to be deleted")
	n1.SetFull(true)
	// n1 refuses the restore (its report is older than its refusal): the
	// sandbox goes back to n2.
	_, err = c.Migrate(ctx, sb.ID, "n1")
	if err == nil || !strings.Contains(err.Error(), "runs on node n2 again") {
		t.Fatalf("a migration whose restore failed: %v", err)
	}
	if got, _ := c.Get(ctx, sb.ID); got.NodeID != "n2" || !n2.IsRunning(sb.ID) {
		t.Fatalf("after a failed migration: %+v", got)
	}
}

// TestDrainMarkOutlivesOlderEvents: a drain mark this server wrote holds
// against the watch's older events of that mark (a drain's event that
// arrives after the undrain), until the write's own event comes back or
// drainEventWait passes; from then on events rule again.
func TestDrainMarkOutlivesOlderEvents(t *testing.T) {
	f := newFleet(state.NewMemory(), nil, nil, slog.New(slog.DiscardHandler))
	put := state.Event{Type: state.EventPut, Entry: state.Entry{Key: nodeDrainPrefix + "n1"}}
	del := state.Event{Type: state.EventDelete, Entry: state.Entry{Key: nodeDrainPrefix + "n1"}}
	drained := func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.drained["n1"]
	}

	f.wroteDrain("n1", true)
	f.wroteDrain("n1", false) // undrained before the drain's event came
	f.apply(put)              // the drain's event, late
	if drained() {
		t.Fatal("the drain's late event undid the undrain written after it")
	}
	f.apply(del) // the undrain's own event
	if drained() {
		t.Fatal("the undrain's event left the node drained")
	}
	f.apply(put) // another server drains it
	if !drained() {
		t.Fatal("a drain after the undrain's event was ignored")
	}

	// A write whose event never comes binds only for drainEventWait.
	f.wroteDrain("n1", false)
	f.mu.Lock()
	w := f.wrote["n1"]
	w.until = time.Now().Add(-time.Millisecond)
	f.wrote["n1"] = w
	f.mu.Unlock()
	f.apply(put)
	if !drained() {
		t.Fatal("an event after drainEventWait was still ignored")
	}
}
