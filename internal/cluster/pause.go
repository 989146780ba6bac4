package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// Pause saves a running sandbox's whole state and releases its CPU, memory
// and network; Connect resumes it. Pausing a paused sandbox is ErrConflict.
func (c *Cluster) Pause(ctx context.Context, id string) error {
	return c.PauseWith(ctx, id, PauseOptions{})
}

// PauseOptions tune PauseWith.
type PauseOptions struct {
	// FilesOnly keeps the sandbox's files, not its memory (E2B's pause
	// with memory: false): its resume boots afresh with them.
	FilesOnly bool
	// Idle: the platform pauses it for being idle, not its owner (see
	// Sandbox.IdlePaused).
	Idle bool
}

// PauseWith is Pause with options.
func (c *Cluster) PauseWith(ctx context.Context, id string, opts PauseOptions) error {
	if cur, _, ok := c.recs.get(id); ok {
		if err := c.withinPausedQuota(cur.TeamID()); err != nil {
			return err
		}
	}
	r, err := c.claim(ctx, id, StateRunning, "pause")
	if err != nil {
		return err
	}
	snap, err := c.snapshotOn(ctx, r.NodeID, &nodev1.SnapshotRequest{SandboxId: id, Kind: string(snapshot.KindPause), Stop: true,
		FilesOnly: opts.FilesOnly})
	if err != nil {
		c.release(ctx, id, "pause")
		return err
	}
	c.gone(id, "")
	c.nodes.left(r.NodeID, r.MemoryMB)
	return c.finishPause(context.WithoutCancel(ctx), id, snap.Id, opts.Idle)
}

// snapshotOn asks node nodeID to snapshot a sandbox.
func (c *Cluster) snapshotOn(ctx context.Context, nodeID string, req *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	n, err := c.nodes.node(nodeID)
	if err != nil {
		return nil, err
	}
	snap, err := n.Snapshot(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("snapshotting sandbox %s on node %s: %w", req.SandboxId, nodeID, classifyNodeError(err))
	}
	return snap, nil
}

// finishPause records that sandbox id is paused in snapshot snapID (for
// being idle, if idle). A sandbox killed meanwhile takes its snapshot with
// it.
func (c *Cluster) finishPause(ctx context.Context, id, snapID string, idle bool) error {
	_, err := c.recs.mutate(ctx, id, func(r *record) error {
		r.State = StatePaused
		r.SnapshotID = snapID
		r.PausedAt = time.Now().UTC()
		r.IdlePaused = idle
		r.Addr = netip.Addr{}
		r.clearOp()
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		c.deleteSnapshotQuietly(snapID, "pause snapshot of a killed sandbox")
	}
	return err
}

// Connect returns a sandbox ready for use, extending its deadline to at
// least now + d; a paused sandbox is resumed first (resumed reports it).
func (c *Cluster) Connect(ctx context.Context, id string, d time.Duration) (sb *Sandbox, resumed bool, err error) {
	return c.ConnectWith(ctx, id, d, ConnectOptions{})
}

// ConnectOptions tune ConnectWith.
type ConnectOptions struct {
	// Reboot resumes a paused sandbox by booting it afresh with its files
	// (E2B's connect with memory: false), not restoring its memory.
	Reboot bool
}

// ConnectWith is Connect with options.
func (c *Cluster) ConnectWith(ctx context.Context, id string, d time.Duration, opts ConnectOptions) (sb *Sandbox, resumed bool, err error) {
	if d <= 0 || d > c.cfg.Limits.MaxTimeout {
		return nil, false, fmt.Errorf("%w: timeout must be between 1s and %s", ErrInvalid, c.cfg.Limits.MaxTimeout)
	}
	cur, err := c.Get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	if cur.State != StatePaused {
		sb, err := c.Refresh(ctx, id, d)
		return sb, false, err
	}
	r, err := c.claim(ctx, id, StatePaused, "resume")
	if err != nil {
		return nil, false, err
	}
	// Claimed first: a reservation of a paused sandbox that no operation
	// holds would be pruned by the next start.
	done, err := c.reserveRunning(ctx, r.TeamID(), id)
	if err != nil {
		c.release(ctx, id, "resume")
		return nil, false, err
	}
	sb, err = c.resume(ctx, r, d, opts)
	done(err == nil)
	if err != nil {
		return nil, false, err
	}
	return sb, true, nil
}

// resume starts claimed paused sandbox r from its snapshot.
func (c *Cluster) resume(ctx context.Context, r record, d time.Duration, opts ConnectOptions) (*Sandbox, error) {
	id := r.ID
	// Any node whose runtime saved the state may resume it; the one it
	// was paused on still has the image at hand.
	p := placement{memoryMB: r.MemoryMB, cpus: r.CPUCount, prefer: r.NodeID, prepared: preparedKey(r.TemplateID)}
	if len(r.Mounts) > 0 {
		p.only = r.NodeID // where its volumes are
	}
	if snap, err := c.snapshotOf(ctx, r.SnapshotID, r.NodeID); err == nil {
		p.runtime, p.runtimeVersion = snap.Runtime, snap.RuntimeVersion
	}
	wreq := restoreRequest(id, r.TeamID(), r.SnapshotID, &r.Spec)
	wreq.Reboot = opts.Reboot
	// Without a store the snapshot is on the node it was paused on, and
	// goes from there to another node that resumes it.
	nsb, n, err := c.start(ctx, p, wreq, r.NodeID)
	if err != nil {
		c.release(ctx, id, "resume")
		return nil, fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	addr, _ := netip.ParseAddr(nsb.Addr)
	return c.finishResume(context.WithoutCancel(ctx), n, id, addr, time.Now().UTC().Add(d))
}

// finishResume records that paused sandbox id runs again at addr on node
// n, and drops the pause snapshot it was resumed from.
func (c *Cluster) finishResume(ctx context.Context, n nodeapi.Node, id string, addr netip.Addr, end time.Time) (*Sandbox, error) {
	var oldSnap, oldNode string
	r, err := c.recs.mutate(ctx, id, func(r *record) error {
		oldSnap, oldNode = r.SnapshotID, r.NodeID
		r.State = StateRunning
		r.PausedAt = time.Time{}
		r.IdlePaused = false
		r.SnapshotID = ""
		r.Addr = addr
		r.EndAt = end
		r.NodeID = n.ID()
		r.clearOp()
		return nil
	})
	if err != nil {
		// Killed while it resumed: the sandbox must not run unrecorded.
		if _, kerr := n.Kill(ctx, &nodev1.KillRequest{SandboxId: id}); kerr != nil && !errors.Is(kerr, nodeapi.ErrNotFound) {
			c.log.Error("killing resumed sandbox without a record", "sandbox_id", id, "err", kerr)
		}
		return nil, fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	// Removing a large image takes a while; the caller need not wait.
	c.deleteSnapshotQuietly(oldSnap, "consumed pause snapshot", oldNode, n.ID())
	return &r.Sandbox, nil
}

// snapshotOf describes snapshot snapID, asking node holder first: without
// a store the nodes share, only that node has it.
func (c *Cluster) snapshotOf(ctx context.Context, snapID, holder string) (*snapshot.Snapshot, error) {
	if n, err := c.nodes.node(holder); err == nil {
		if w, err := n.GetSnapshot(ctx, &nodev1.GetSnapshotRequest{IdOrName: snapID}); err == nil {
			return nodeapi.SnapshotFromWire(w), nil
		}
	}
	return c.GetSnapshotAny(ctx, snapID)
}

// resumeWait bounds how long traffic to a paused sandbox waits for the
// resume it caused (or another request's).
const resumeWait = time.Minute

// AutoResume resumes paused sandbox id for traffic that reached it, if it
// asked for that (lifecycle.autoResume), with the timeout it was created
// with, or if it was paused for being idle, with the deadline it had; a
// resume already under way (another request's) is waited for. It reports
// whether the sandbox runs now.
func (c *Cluster) AutoResume(ctx context.Context, id string) (bool, error) {
	deadline := time.Now().Add(resumeWait)
	for {
		sb, err := c.Get(ctx, id)
		if err != nil {
			return false, err
		}
		if sb.State == StateRunning && sb.Addr.IsValid() {
			return true, nil
		}
		timeout := sb.Timeout
		switch {
		case sb.IdlePaused:
			// Its owner did not pause it: the pause must not have
			// moved its deadline. One that passed meanwhile is the
			// leader's to end (expireIdlePaused).
			if timeout = time.Until(sb.EndAt); timeout <= 0 {
				return false, nil
			}
		case !sb.AutoResume:
			return false, nil
		case timeout <= 0 || timeout > c.cfg.Limits.MaxTimeout:
			timeout = 5 * time.Minute
		}
		_, _, err = c.Connect(ctx, id, timeout)
		if err == nil {
			c.log.Info("sandbox resumed by traffic", "sandbox_id", id)
			return true, nil
		}
		if !errors.Is(err, ErrConflict) || time.Now().After(deadline) {
			return false, err
		}
		// Another request is resuming it: wait for that.
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
