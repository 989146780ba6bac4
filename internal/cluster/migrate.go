package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// Migration is the outcome of Migrate.
type Migration struct {
	Sandbox *Sandbox
	// From is the node the sandbox left.
	From string
	// Downtime is how long the sandbox did not run: from the start of
	// its snapshot to the end of its restore.
	Downtime time.Duration
}

// Migrate moves a running sandbox to another node (target, or the one
// placement picks): its whole state is saved, it is restored there under
// the same id (so the same URL), with its deadline, and its record moves
// with it. Connections to it are cut: streams end with an error clients
// retry, and the sandbox's own outbound connections are reset. If the
// restore fails the sandbox is restored where it was; failing that, it
// stays paused with its state, never lost.
//
// A migration ends with ctx or with the cluster (Close). Cancelled before
// the sandbox runs on its new node, it rolls back: the sandbox is
// restored where it was (its volumes moved back), whatever the new node
// may have started is killed, and the migration's snapshot is deleted;
// the error wraps ctx's. Once the sandbox runs on the new node the move
// is finished rather than undone (that would stop it a second time).
func (c *Cluster) Migrate(ctx context.Context, id, target string) (*Migration, error) {
	ctx, done, ok := c.bg.join(ctx)
	defer done()
	if !ok {
		return nil, fmt.Errorf("migrating sandbox %s: %w: the server is shutting down", id, ErrUnavailable)
	}
	r, err := c.claim(ctx, id, StateRunning, "migrate")
	if err != nil {
		return nil, err
	}
	from := r.NodeID
	if others := c.volumeSharers(&r); len(others) > 0 {
		c.release(ctx, id, "migrate")
		return nil, fmt.Errorf("%w: sandbox %s mounts volumes that sandboxes %v mount too; they cannot leave node %s apart", ErrInvalid, id, others, from)
	}
	// The target is chosen before anything stops.
	p := placement{memoryMB: r.MemoryMB, cpus: r.CPUCount, exclude: []string{from}, only: target, prepared: preparedKey(r.TemplateID)}
	p.runtime, p.runtimeVersion = c.nodes.runtimeOf(from)
	if target == from {
		c.release(ctx, id, "migrate")
		return nil, fmt.Errorf("%w: sandbox %s already runs on node %s", ErrInvalid, id, from)
	}
	dest, err := c.nodes.place(p)
	if err != nil {
		c.release(ctx, id, "migrate")
		return nil, fmt.Errorf("migrating sandbox %s: %w", id, err)
	}
	start := time.Now()
	snap, err := c.snapshotOn(ctx, from, &nodev1.SnapshotRequest{SandboxId: id, Kind: string(snapshot.KindPause), Stop: true})
	if err != nil {
		c.release(ctx, id, "migrate")
		return nil, fmt.Errorf("migrating sandbox %s: %w", id, err)
	}
	c.gone(id, "")
	// From here on the sandbox exists only as its saved state: whatever
	// fails, it must end up running somewhere or recorded as paused. What
	// undoes the move runs to its end, cancelled or not; the move itself
	// stops at the first step ctx has ended by.
	cancelled := ctx
	ctx = context.WithoutCancel(ctx)
	req := restoreRequest(id, r.TeamID(), snap.Id, &r.Spec)
	// to is where the move went (dest is where the sandbox runs in
	// the end): it may keep a copy of the snapshot.
	to := dest.ID()
	// Its volumes go along (through the store), before it starts there.
	rerr := cancelled.Err()
	if rerr == nil {
		rerr = c.moveVolumes(cancelled, r.Mounts, from, dest)
	}
	var nsb *nodev1.Sandbox
	if rerr == nil {
		rerr = cancelled.Err()
	}
	if rerr == nil {
		// Without a store the snapshot goes from the node that took it.
		rerr = c.bringSnapshot(cancelled, id, snap.Id, from, dest)
		if rerr != nil {
			c.abortImport(ctx, dest, snap.Id)
		}
	}
	if rerr == nil {
		nsb, rerr = dest.Create(cancelled, req)
		if rerr != nil && cancelled.Err() != nil {
			// Cut short, the new node may have started it all the same.
			c.killQuietly(ctx, dest, id, "half-migrated sandbox")
		}
	}
	// undone is why the move was called off, when it was.
	var undone error
	if rerr != nil && cancelled.Err() != nil {
		undone = context.Cause(cancelled)
	}
	if rerr != nil && len(r.Mounts) > 0 {
		// What moved goes back, for the restore where it was.
		back, err := c.nodes.node(from)
		if err == nil {
			err = c.moveVolumes(ctx, r.Mounts, dest.ID(), back)
		}
		if err != nil {
			c.log.Error("moving volumes back after a failed migration", "sandbox_id", id, "err", err)
		}
	}
	if rerr != nil {
		c.log.Warn("restoring a migrating sandbox on its new node failed; restoring it where it was",
			"sandbox_id", id, "from", from, "to", dest.ID(), "err", rerr)
		back, berr := c.nodes.node(from)
		if berr == nil {
			dest = back
			nsb, berr = back.Create(ctx, req)
		}
		if berr != nil {
			c.log.Error("migrating sandbox failed; it stays paused", "sandbox_id", id, "err", berr)
			if err := c.finishPause(ctx, id, snap.Id, false); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("migrating sandbox %s: restoring it on node %s: %w (it is paused; connect resumes it)",
				id, p.describe(), classifyNodeError(rerr))
		}
	}
	addr, _ := netip.ParseAddr(nsb.Addr)
	sb, err := c.finishResume(ctx, dest, id, addr, r.EndAt)
	if err != nil {
		return nil, err
	}
	// The move's state was never the record's (it ran throughout), so
	// finishResume has no snapshot to drop: this one is the move's own.
	c.deleteSnapshotQuietly(snap.Id, "migration snapshot", from, to)
	down := time.Since(start)
	if undone != nil {
		c.log.Info("migration called off; the sandbox runs where it was", "sandbox_id", id, "node_id", from, "err", undone)
		return nil, fmt.Errorf("migrating sandbox %s: %w (rolled back: it runs on node %s again)", id, undone, from)
	}
	if rerr != nil {
		return nil, fmt.Errorf("migrating sandbox %s: restoring it on another node: %w (it runs on node %s again)",
			id, classifyNodeError(rerr), from)
	}
	c.log.Info("sandbox migrated", "sandbox_id", id, "from", from, "to", dest.ID(), "downtime_ms", down.Milliseconds())
	return &Migration{Sandbox: sb, From: from, Downtime: down}, nil
}

// evacuate moves every running sandbox off a node that is going away (it
// said so: a node agent stopping with --on-stop=drain): each is migrated
// to another node, or, where none can take it, paused into the store.
// The elected server does it, so each sandbox is moved once, a few at a
// time, until ctx (the cluster's own) ends.
func (c *Cluster) evacuate(ctx context.Context, nodeID string) {
	defer c.nodes.endEvacuation(nodeID)
	c.nodes.setDrained(nodeID, true)
	var ids []string
	c.recs.each(func(r *record) {
		if r.NodeID == nodeID && r.State == StateRunning {
			ids = append(ids, r.ID)
		}
	})
	c.log.Info("node is going away; moving its sandboxes", "node_id", nodeID, "sandboxes", len(ids))
	var g errgroup.Group
	g.SetLimit(evacuateWorkers)
	for _, id := range ids {
		if ctx.Err() != nil {
			// This server is closing; the node repeats that it is going
			// away, and the next leader moves the rest.
			break
		}
		g.Go(func() error {
			c.evacuateOne(ctx, id)
			return nil
		})
	}
	g.Wait()
}

// evacuateWorkers bounds the migrations of one evacuation at once: they
// overlap the snapshot of one with the restore of another, without
// flooding the store or the node going away.
const evacuateWorkers = 4

// evacuateOne migrates sandbox id off a node going away, or pauses it
// into the store if it cannot go elsewhere. Cancelled (the server is
// closing), it leaves the sandbox where it was (Migrate rolls back).
func (c *Cluster) evacuateOne(ctx context.Context, id string) {
	_, err := c.Migrate(ctx, id, "")
	switch {
	case err == nil, errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict):
		return // moved, or gone or busy meanwhile
	case ctx.Err() != nil:
		return
	}
	c.log.Warn("moving a sandbox off a node going away failed; pausing it", "sandbox_id", id, "err", err)
	if err := c.Pause(ctx, id); err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrConflict) {
		c.log.Error("pausing a sandbox of a node going away", "sandbox_id", id, "err", err)
	}
}

// killQuietly kills sandbox id on node n, if it runs there, logging a
// failure: for what must not run unrecorded.
func (c *Cluster) killQuietly(ctx context.Context, n nodeapi.Node, id, what string) {
	if _, err := n.Kill(ctx, &nodev1.KillRequest{SandboxId: id}); err != nil && !errors.Is(err, nodeapi.ErrNotFound) {
		c.log.Error("killing "+what, "sandbox_id", id, "node_id", n.ID(), "err", err)
	}
}
