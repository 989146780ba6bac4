package cluster

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// hookNode is a fake node that runs a test's hooks around its snapshots
// and creates: where a migration is cancelled.
type hookNode struct {
	*nodetest.Fake
	// afterSnapshot runs once a snapshot is taken.
	afterSnapshot func()
	// create, if set, answers Create; real is the fake's own.
	create func(ctx context.Context, req *nodev1.CreateRequest, real func() (*nodev1.Sandbox, error)) (*nodev1.Sandbox, error)
}

func (n *hookNode) Snapshot(ctx context.Context, req *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	s, err := n.Fake.Snapshot(ctx, req)
	if err == nil && n.afterSnapshot != nil {
		n.afterSnapshot()
	}
	return s, err
}

func (n *hookNode) Create(ctx context.Context, req *nodev1.CreateRequest) (*nodev1.Sandbox, error) {
	real := func() (*nodev1.Sandbox, error) { return n.Fake.Create(ctx, req) }
	if n.create != nil {
		return n.create(ctx, req, real)
	}
	return real()
}

// hookFleet is remoteFleet over hookNodes.
func hookFleet(t *testing.T, st state.Store, nodes ...*hookNode) *Cluster {
	t.Helper()
	ctx := context.Background()
	byAddr := map[string]nodeapi.Node{}
	for _, n := range nodes {
		byAddr["addr-"+n.ID()] = n
		reg, err := membership.RegisterNode(ctx, st, membership.Reporter(n, "addr-"+n.ID()), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Stop)
	}
	c, err := Open(ctx, Config{State: st, Candidate: "api", TickInterval: 20 * time.Millisecond,
		Dial: func(id, addr string) nodeapi.Node { return byAddr[addr] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx, StopKeep) })
	waitFor(t, func() bool {
		c.nodes.mu.Lock()
		defer c.nodes.mu.Unlock()
		return len(c.nodes.members) == len(nodes)
	}, "the nodes to be seen")
	return c
}

// TestMigrateCancelled: a migration cancelled after its snapshot, at each
// step until the sandbox runs on its new node (right after the snapshot,
// during the restore there, by Close), rolls back: the sandbox runs where
// it was under the same record, nothing of it runs on the new node, no
// operation mark or snapshot is left, and the error says it was
// cancelled. Cancelled once it runs there, the move is finished.
func TestMigrateCancelled(t *testing.T) {
	type setup struct {
		c        *Cluster
		src, dst *hookNode
		cancel   context.CancelFunc
		// closed is closed once the cluster's Close returned.
		closed chan struct{}
	}
	// untilDone waits for ctx to end, as a node call cut short does; a
	// migration that is not cancelled fails here instead of hanging.
	untilDone := func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
			return errors.New("the migration's context did not end")
		}
	}
	steps := []struct {
		name string
		arm  func(s *setup)
		// closeCluster makes Close the cancellation, not the caller.
		closeCluster bool
		// finished: the move completes despite the cancellation.
		finished bool
	}{
		{name: "after the snapshot", arm: func(s *setup) { s.src.afterSnapshot = s.cancel }},
		{name: "during the restore, nothing started", arm: func(s *setup) {
			s.dst.create = func(ctx context.Context, _ *nodev1.CreateRequest, _ func() (*nodev1.Sandbox, error)) (*nodev1.Sandbox, error) {
				s.cancel()
				return nil, untilDone(ctx)
			}
		}},
		{name: "during the restore, started all the same", arm: func(s *setup) {
			// A remote create cut short that the node finished anyway.
			s.dst.create = func(ctx context.Context, _ *nodev1.CreateRequest, real func() (*nodev1.Sandbox, error)) (*nodev1.Sandbox, error) {
				if _, err := real(); err != nil {
					return nil, err
				}
				s.cancel()
				return nil, context.Canceled
			}
		}},
		{name: "by Close", closeCluster: true, arm: func(s *setup) {
			s.dst.create = func(ctx context.Context, _ *nodev1.CreateRequest, _ func() (*nodev1.Sandbox, error)) (*nodev1.Sandbox, error) {
				go func() {
					defer close(s.closed)
					s.c.Close(context.Background(), StopKeep)
				}()
				return nil, untilDone(ctx)
			}
		}},
		{name: "once it runs there", finished: true, arm: func(s *setup) {
			s.dst.create = func(ctx context.Context, _ *nodev1.CreateRequest, real func() (*nodev1.Sandbox, error)) (*nodev1.Sandbox, error) {
				defer s.cancel()
				return real()
			}
		}},
	}
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			ctx := context.Background()
			st := state.NewMemory()
			fakes := nodetest.NewFakes("n1", "n2")
			src, dst := &hookNode{Fake: fakes[0]}, &hookNode{Fake: fakes[1]}
			c := hookFleet(t, st, src, dst)
			if _, err := c.SetDraining(ctx, "n2", true); err != nil {
				t.Fatal(err)
			}
			sb := create(t, c, time.Hour)
			if _, err := c.SetDraining(ctx, "n2", false); err != nil {
				t.Fatal(err)
			}
			mctx, cancel := context.WithCancel(ctx)
			defer cancel()
			s := &setup{c: c, src: src, dst: dst, cancel: cancel, closed: make(chan struct{})}
			step.arm(s)

			m, err := c.Migrate(mctx, sb.ID, "n2")
			want, other := "n1", dst.Fake
			if step.finished {
				want, other = "n2", src.Fake
				if err != nil || m.Sandbox.NodeID != "n2" {
					t.Fatalf("a move cancelled once it ran there: %+v, %v; want it finished", m, err)
				}
			} else if !errors.Is(err, context.Canceled) {
				t.Fatalf("cancelled migration: %v, want an error wrapping context.Canceled", err)
			}
			if !fakes[map[string]int{"n1": 0, "n2": 1}[want]].IsRunning(sb.ID) || other.IsRunning(sb.ID) {
				t.Fatalf("after the migration the sandbox runs on n1 %v, n2 %v; want only %s",
					src.IsRunning(sb.ID), dst.IsRunning(sb.ID), want)
			}
			// Its record, as the store holds it (the cluster may be closed).
			e, err := st.Get(ctx, sandboxKey(sb.ID))
			if err != nil {
				t.Fatal(err)
			}
			r, err := decodeRecord(nil, e)
			if err != nil {
				t.Fatal(err)
			}
			if r.NodeID != want || r.State != StateRunning || r.Op != "" || !r.Addr.IsValid() || !r.EndAt.Equal(sb.EndAt) {
				t.Fatalf("record after the migration: %+v; want it running on %s, no operation, same deadline", r, want)
			}
			if step.closeCluster {
				<-s.closed
				if _, err := c.Migrate(ctx, sb.ID, "n2"); !errors.Is(err, ErrUnavailable) {
					t.Fatalf("a migration after Close: %v, want ErrUnavailable", err)
				}
			}
			waitFor(t, func() bool { return src.SnapshotCount() == 0 }, "the migration's snapshot to be deleted")
		})
	}
}
