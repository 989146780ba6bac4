package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// claim marks a sandbox in state want busy with op, in the store, so that
// no other operation (from this server or another) interleaves; release
// clears the mark. A mark older than staleOp is taken over.
func (c *Cluster) claim(ctx context.Context, id string, want State, op string) (record, error) {
	return c.recs.mutate(ctx, id, func(r *record) error {
		if r.Op != "" && time.Since(r.OpSince) < staleOp {
			return fmt.Errorf("%w: sandbox %s is busy (%s in progress)", ErrConflict, id, r.Op)
		}
		if r.State != want {
			return fmt.Errorf("%w: sandbox %s is %s", ErrConflict, id, r.State)
		}
		r.Op, r.OpSince = op, time.Now().UTC()
		return nil
	})
}

func (c *Cluster) release(ctx context.Context, id, op string) {
	_, err := c.recs.mutate(context.WithoutCancel(ctx), id, func(r *record) error {
		if r.Op != op {
			return errUnchanged
		}
		r.clearOp()
		return nil
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		c.log.Warn("clearing operation mark", "sandbox_id", id, "op", op, "err", err)
	}
}

// Pause saves a running sandbox's whole state and releases its CPU, memory
// and network; Connect resumes it. Pausing a paused sandbox is ErrConflict.
func (c *Cluster) Pause(ctx context.Context, id string) error {
	if _, err := c.claim(ctx, id, StateRunning, "pause"); err != nil {
		return err
	}
	snap, err := c.cfg.Node.Snapshot(ctx, id, node.SnapshotOptions{Kind: snapshot.KindPause, Stop: true})
	if err != nil {
		c.release(ctx, id, "pause")
		if errors.Is(err, node.ErrUnsupported) {
			return fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		return err
	}
	c.gone(id)
	return c.finishPause(context.WithoutCancel(ctx), id, snap.ID)
}

// finishPause records that sandbox id is paused in snapshot snapID. A
// sandbox killed meanwhile takes its snapshot with it.
func (c *Cluster) finishPause(ctx context.Context, id, snapID string) error {
	_, err := c.recs.mutate(ctx, id, func(r *record) error {
		r.State = StatePaused
		r.SnapshotID = snapID
		r.Addr = netipZero
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
	if err := c.admitting(ctx); err != nil {
		return nil, false, err
	}
	r, err := c.claim(ctx, id, StatePaused, "resume")
	if err != nil {
		return nil, false, err
	}
	nsb, err := c.cfg.Node.Create(ctx, node.CreateRequest{
		SandboxID:  id,
		TemplateID: r.SnapshotID,
		Network:    netns.SlotOptions{AllowInternet: r.AllowInternet},
	})
	if err != nil {
		c.release(ctx, id, "resume")
		return nil, false, fmt.Errorf("resuming sandbox %s: %w", id, classifyNodeError(err))
	}
	out, err := c.finishResume(context.WithoutCancel(ctx), id, nsb.Addr, time.Now().UTC().Add(d))
	if err != nil {
		return nil, false, err
	}
	return out, true, nil
}

// finishResume records that paused sandbox id runs again at addr, and
// drops the pause snapshot it was resumed from.
func (c *Cluster) finishResume(ctx context.Context, id string, addr netip.Addr, end time.Time) (*Sandbox, error) {
	var oldSnap string
	r, err := c.recs.mutate(ctx, id, func(r *record) error {
		oldSnap = r.SnapshotID
		r.State = StateRunning
		r.SnapshotID = ""
		r.Addr = addr
		r.EndAt = end
		r.NodeID = c.cfg.Node.ID()
		r.clearOp()
		return nil
	})
	if err != nil {
		// Killed while it resumed: the sandbox must not run unrecorded.
		if kerr := c.cfg.Node.Kill(ctx, id); kerr != nil && !errors.Is(kerr, node.ErrNotFound) {
			c.log.Error("killing resumed sandbox without a record", "sandbox_id", id, "err", kerr)
		}
		return nil, fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	// Removing a large image takes a while; the caller need not wait.
	go c.deleteSnapshotQuietly(oldSnap, "consumed pause snapshot")
	return &r.Sandbox, nil
}

// Snapshot saves a running sandbox's state as a snapshot usable as a
// template; the sandbox keeps running.
func (c *Cluster) Snapshot(ctx context.Context, id, name string) (*snapshot.Snapshot, error) {
	if name != "" && !snapshot.ValidID(name) {
		return nil, fmt.Errorf("%w: invalid snapshot name %q", ErrInvalid, name)
	}
	if _, err := c.claim(ctx, id, StateRunning, "snapshot"); err != nil {
		return nil, err
	}
	defer c.release(ctx, id, "snapshot")
	var names []string
	if name != "" {
		if _, err := c.cfg.Node.GetSnapshot(ctx, name); err == nil {
			return nil, fmt.Errorf("%w: a snapshot named %q exists", ErrConflict, name)
		}
		names = []string{name}
	}
	snap, err := c.cfg.Node.Snapshot(ctx, id, node.SnapshotOptions{Kind: snapshot.KindSnapshot, Names: names})
	if errors.Is(err, node.ErrUnsupported) {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	return snap, err
}

// ForkResult is the outcome for one child of a fork.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// MaxForkCount bounds one fork request.
const MaxForkCount = 100

// forkParallelism bounds concurrent restores: each is CPU-bound, and on a
// small host more at once are not faster than one after another.
const forkParallelism = 2

// Fork snapshots a running sandbox (which keeps running) and starts count
// independent children from that state, each with its own id, network,
// memory and writable files.
func (c *Cluster) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	if count < 1 || count > MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", ErrInvalid, MaxForkCount)
	}
	if timeout <= 0 || timeout > c.cfg.Limits.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1s and %s", ErrInvalid, c.cfg.Limits.MaxTimeout)
	}
	if err := c.admitting(ctx); err != nil {
		return nil, err
	}
	r, err := c.claim(ctx, id, StateRunning, "fork")
	if err != nil {
		return nil, err
	}
	parent := r.Sandbox
	snap, err := c.cfg.Node.Snapshot(ctx, id, node.SnapshotOptions{Kind: snapshot.KindFork})
	c.release(ctx, id, "fork")
	if err != nil {
		if errors.Is(err, node.ErrUnsupported) {
			return nil, fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		return nil, err
	}
	defer func() { go c.deleteSnapshotQuietly(snap.ID, "fork snapshot") }()

	results := make([]ForkResult, count)
	sem := make(chan struct{}, forkParallelism)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			nsb, err := c.cfg.Node.Create(ctx, node.CreateRequest{
				TemplateID: snap.ID,
				Network:    netns.SlotOptions{AllowInternet: parent.AllowInternet},
			})
			if err != nil {
				results[i].Err = classifyNodeError(err)
				return
			}
			sb, err := c.register(ctx, nsb, registration{
				requestedTemplate: parent.TemplateID, metadata: parent.Metadata, timeout: timeout,
				autoPause: parent.AutoPause, allowInternet: parent.AllowInternet,
			})
			results[i] = ForkResult{Sandbox: sb, Err: err}
		}()
	}
	wg.Wait()
	return results, nil
}

func (c *Cluster) deleteSnapshotQuietly(id, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.cfg.Node.DeleteSnapshot(ctx, id); err != nil {
		c.log.Warn("deleting "+what, "snapshot_id", id, "err", err)
	}
}

// Snapshots lists user snapshots.
func (c *Cluster) Snapshots(ctx context.Context) ([]*snapshot.Snapshot, error) {
	return c.cfg.Node.Snapshots(ctx, snapshot.KindSnapshot)
}

// GetSnapshot returns a user snapshot by id or name.
func (c *Cluster) GetSnapshot(ctx context.Context, idOrName string) (*snapshot.Snapshot, error) {
	s, err := c.cfg.Node.GetSnapshot(ctx, idOrName)
	if err != nil || s.Kind != snapshot.KindSnapshot {
		return nil, fmt.Errorf("%w: snapshot %q", ErrNotFound, idOrName)
	}
	return s, nil
}

// DeleteSnapshot removes a user snapshot.
func (c *Cluster) DeleteSnapshot(ctx context.Context, idOrName string) error {
	s, err := c.GetSnapshot(ctx, idOrName)
	if err != nil {
		return err
	}
	return c.cfg.Node.DeleteSnapshot(ctx, s.ID)
}

// TemplateUsers counts the sandboxes (running or paused) and snapshots that
// run on template templateID's root filesystem: while there are any, the
// template must not be deleted.
func (c *Cluster) TemplateUsers(ctx context.Context, templateID string) (int, error) {
	n := 0
	c.recs.each(func(r *record) {
		if r.TemplateID == templateID {
			n++
		}
	})
	snaps, err := c.cfg.Node.Snapshots(ctx)
	if err != nil {
		return 0, err
	}
	for _, s := range snaps {
		if s.TemplateID == templateID {
			n++
		}
	}
	return n, nil
}
