package cluster

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// gauge counts calls that take a while: how many are under way, the most
// at once, how many ended.
type gauge struct {
	delay           time.Duration
	now, most, done atomic.Int32
}

// wait waits out the delay as one more call under way.
func (g *gauge) wait() {
	if g.delay == 0 {
		return
	}
	now := g.now.Add(1)
	for most := g.most.Load(); now > most && !g.most.CompareAndSwap(most, now); most = g.most.Load() {
	}
	time.Sleep(g.delay)
	g.now.Add(-1)
	g.done.Add(1)
}

// slowNode is a fake node whose kills, snapshots and lists take a while
// (those with a delay), counted.
type slowNode struct {
	*nodetest.Fake
	kills, snapshots, lists gauge
}

func (n *slowNode) Kill(ctx context.Context, req *nodev1.KillRequest) (*nodev1.KillResponse, error) {
	n.kills.wait()
	return n.Fake.Kill(ctx, req)
}

func (n *slowNode) List(ctx context.Context, req *nodev1.ListRequest) (*nodev1.ListResponse, error) {
	n.lists.wait()
	return n.Fake.List(ctx, req)
}

func (n *slowNode) Snapshot(ctx context.Context, req *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	n.snapshots.wait()
	return n.Fake.Snapshot(ctx, req)
}

// TestDeadlineExpiryBounded: sandboxes due at once are ended at most
// expiryWorkers at a time; a cluster closed while more are due finishes
// the ones under way, starts no more and leaves no goroutine behind.
func TestDeadlineExpiryBounded(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	ctx := context.Background()
	n := &slowNode{Fake: nodetest.NewFake("n1"), kills: gauge{delay: 50 * time.Millisecond}}
	n.SetMemoryMB(65536)
	c, err := Open(ctx, Config{State: state.NewMemory(), Local: n, Candidate: "owners", TickInterval: 10 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	due := func(count int) []string {
		var ids []string
		for range count {
			sb := create(t, c, time.Hour)
			ids = append(ids, sb.ID)
		}
		for _, id := range ids {
			if _, err := c.recs.mutate(ctx, id, func(r *record) error { r.EndAt = time.Now().Add(-time.Second); return nil }); err != nil {
				t.Fatal(err)
			}
		}
		return ids
	}
	first := due(40)
	waitFor(t, func() bool {
		for _, id := range first {
			if n.IsRunning(id) {
				return false
			}
		}
		return true
	}, "every overdue sandbox to be killed")
	if most := n.kills.most.Load(); most != expiryWorkers {
		t.Fatalf("%d kills of overdue sandboxes ran at once, want %d", most, expiryWorkers)
	}

	n.kills.done.Store(0)
	due(40)
	waitFor(t, func() bool { return n.kills.now.Load() > 0 }, "the next kills to begin")
	c.Close(ctx, StopKeep)
	killed := n.kills.done.Load()
	if killed >= 40 {
		t.Fatalf("all %d overdue sandboxes were killed before Close returned", killed)
	}
	time.Sleep(4 * n.kills.delay)
	if after := n.kills.done.Load(); after != killed {
		t.Fatalf("%d kills after Close returned", after-killed)
	}
	goleak.VerifyNone(t, leaks)
}

// TestEvacuationStopsWithClose: a node going away has its sandboxes
// migrated at most evacuateWorkers at a time, and a cluster closed meanwhile
// stops there: the migrations under way finish, the other sandboxes stay
// running where they are (neither moved nor paused), and no goroutine
// outlives Close.
func TestEvacuationStopsWithClose(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	ctx := context.Background()
	st := state.NewMemory()
	nodes := nodetest.NewFakes("n1", "n2")
	n1, n2 := &slowNode{Fake: nodes[0], snapshots: gauge{delay: 100 * time.Millisecond}}, nodes[1]
	n1.SetMemoryMB(65536)
	n2.SetMemoryMB(65536)
	byAddr := map[string]nodeapi.Node{"addr-n1": n1, "addr-n2": n2}
	log := slog.New(slog.DiscardHandler)
	var regs []*membership.Registration
	for addr, n := range byAddr {
		reg, err := membership.RegisterNode(ctx, st, membership.Reporter(n, addr), log)
		if err != nil {
			t.Fatal(err)
		}
		regs = append(regs, reg)
	}
	c, err := Open(ctx, Config{State: st, Candidate: "owners", TickInterval: 10 * time.Millisecond, Logger: log,
		Dial: func(id, addr string) nodeapi.Node { return byAddr[addr] }})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		c.nodes.mu.Lock()
		defer c.nodes.mu.Unlock()
		return len(c.nodes.members) == 2 && c.leading.Load()
	}, "the nodes to be seen and the cluster to lead")
	if _, err := c.SetDraining(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 40 {
		ids = append(ids, create(t, c, time.Hour).ID)
	}
	if _, err := c.SetDraining(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}

	if err := n1.Publish(ctx, &nodev1.Event{Kind: nodev1.Event_KIND_DRAINING}); err != nil {
		t.Fatal(err)
	}
	// Two rounds done, counted where they end: a migration whose snapshot
	// is taken but whose restore is still under way when Close comes rolls
	// back (seen under load), so snapshots taken are not moves made.
	waitFor(t, func() bool {
		moved := 0
		for _, id := range ids {
			if n2.IsRunning(id) {
				moved++
			}
		}
		return moved >= 2*evacuateWorkers
	}, "two rounds of migrations")
	c.Close(ctx, StopKeep)
	for _, r := range regs {
		r.Stop()
	}
	goleak.VerifyNone(t, leaks)

	if most := n1.snapshots.most.Load(); most != evacuateWorkers {
		t.Errorf("%d migrations off the node going away ran at once, want %d", most, evacuateWorkers)
	}
	moved := 0
	for _, id := range ids {
		on1, on2 := n1.IsRunning(id), n2.IsRunning(id)
		if on1 == on2 {
			t.Fatalf("sandbox %s runs on n1: %v, on n2: %v; want one of them", id, on1, on2)
		}
		if on2 {
			moved++
		}
	}
	if moved == len(ids) || moved < 2*evacuateWorkers {
		t.Fatalf("%d of %d sandboxes moved before and while Close: want the evacuation cut short", moved, len(ids))
	}
	t.Logf("%d of %d sandboxes moved before the cluster closed", moved, len(ids))
}

// TestCloseDuringEvents: a node's events keep coming while the cluster
// closes; what they start (a SYNC's comparison of records with the node's
// list) is refused once Close has begun, and nothing of it runs after
// Close returns.
func TestCloseDuringEvents(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	ctx := context.Background()
	st := state.NewMemory()
	n := &slowNode{Fake: nodetest.NewFake("n1"), lists: gauge{delay: 20 * time.Millisecond}}
	reg, err := membership.RegisterNode(ctx, st, membership.Reporter(n, "addr-n1"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(ctx, Config{State: st, Candidate: "owners", Logger: slog.New(slog.DiscardHandler),
		Dial: func(id, addr string) nodeapi.Node { return n }})
	if err != nil {
		t.Fatal(err)
	}
	pumpCtx, stop := context.WithCancel(ctx)
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		for n.Publish(pumpCtx, &nodev1.Event{Kind: nodev1.Event_KIND_SYNC}) == nil {
		}
	}()
	waitFor(t, func() bool { return n.lists.done.Load() >= 3 }, "the node's SYNC events to be handled")
	c.Close(ctx, StopKeep)
	if now := n.lists.now.Load(); now != 0 {
		t.Fatalf("%d lists of the node under way after Close returned", now)
	}
	handled := n.lists.done.Load()
	time.Sleep(5 * n.lists.delay)
	if after := n.lists.done.Load(); after != handled {
		t.Fatalf("%d lists of the node after Close returned", after-handled)
	}
	stop()
	<-pumped
	reg.Stop()
	goleak.VerifyNone(t, leaks)
}
