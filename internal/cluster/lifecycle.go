package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// claim marks a running sandbox busy for a state change; release undoes it.
func (c *Cluster) claim(id string, want State) (*record, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.records[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if r.busy {
		return nil, fmt.Errorf("%w: sandbox %s is being paused, resumed or snapshotted", ErrConflict, id)
	}
	if r.sb.State != want {
		return nil, fmt.Errorf("%w: sandbox %s is %s", ErrConflict, id, r.sb.State)
	}
	r.busy = true
	return r, nil
}

func (c *Cluster) release(r *record) {
	c.mu.Lock()
	r.busy = false
	c.mu.Unlock()
}

// Pause saves a running sandbox's whole state and releases its CPU, memory
// and network; Connect resumes it. Pausing a paused sandbox is ErrConflict.
func (c *Cluster) Pause(ctx context.Context, id string) error {
	r, err := c.claim(id, StateRunning)
	if err != nil {
		return err
	}
	defer c.release(r)
	snap, err := c.cfg.Node.Snapshot(ctx, id, node.SnapshotOptions{Kind: snapshot.KindPause, Stop: true})
	if err != nil {
		if errors.Is(err, node.ErrUnsupported) {
			return fmt.Errorf("%w: %v", ErrUnsupported, err)
		}
		return err
	}
	c.gone(id)
	c.mu.Lock()
	if r.timer != nil {
		r.timer.Stop()
	}
	r.sb.State = StatePaused
	r.sb.SnapshotID = snap.ID
	r.sb.Addr = netipZero
	sb := r.sb
	c.mu.Unlock()
	if err := c.savePausedRecord(&sb); err != nil {
		c.log.Warn("persisting paused sandbox record", "sandbox_id", id, "err", err)
	}
	return nil
}

// Connect returns a sandbox ready for use, extending its deadline to at
// least now + d; a paused sandbox is resumed first (resumed reports it).
func (c *Cluster) Connect(ctx context.Context, id string, d time.Duration) (sb *Sandbox, resumed bool, err error) {
	if d <= 0 || d > c.cfg.Limits.MaxTimeout {
		return nil, false, fmt.Errorf("%w: timeout must be between 1s and %s", ErrInvalid, c.cfg.Limits.MaxTimeout)
	}
	c.mu.Lock()
	r, ok := c.records[id]
	paused := ok && r.sb.State == StatePaused
	c.mu.Unlock()
	if !ok {
		return nil, false, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if !paused {
		sb, err := c.Refresh(id, d)
		return sb, false, err
	}
	r, err = c.claim(id, StatePaused)
	if err != nil {
		return nil, false, err
	}
	defer c.release(r)
	nsb, err := c.cfg.Node.Create(ctx, node.CreateRequest{
		SandboxID:  id,
		TemplateID: r.sb.SnapshotID,
		Network:    netns.SlotOptions{AllowInternet: r.sb.AllowInternet},
	})
	if err != nil {
		return nil, false, fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	oldSnap := r.sb.SnapshotID
	c.mu.Lock()
	r.sb.State = StateRunning
	r.sb.SnapshotID = ""
	r.sb.Addr = nsb.Addr
	r.sb.EndAt = time.Now().UTC().Add(d)
	c.armLocked(r)
	out := r.sb
	out.Metadata = maps.Clone(r.sb.Metadata)
	c.mu.Unlock()
	c.removePausedRecord(id)
	// Removing a large image takes a while; the caller need not wait.
	go c.deleteSnapshotQuietly(oldSnap, "consumed pause snapshot")
	return &out, true, nil
}

// Snapshot saves a running sandbox's state as a snapshot usable as a
// template; the sandbox keeps running.
func (c *Cluster) Snapshot(ctx context.Context, id, name string) (*snapshot.Snapshot, error) {
	if name != "" && !snapshot.ValidID(name) {
		return nil, fmt.Errorf("%w: invalid snapshot name %q", ErrInvalid, name)
	}
	r, err := c.claim(id, StateRunning)
	if err != nil {
		return nil, err
	}
	defer c.release(r)
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
	r, err := c.claim(id, StateRunning)
	if err != nil {
		return nil, err
	}
	parent := r.sb
	parent.Metadata = maps.Clone(r.sb.Metadata)
	snap, err := c.cfg.Node.Snapshot(ctx, id, node.SnapshotOptions{Kind: snapshot.KindFork})
	c.release(r)
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
				results[i].Err = err
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

// pausedRecordPath is where a paused sandbox's record is kept.
func (c *Cluster) pausedRecordPath(id string) string {
	return filepath.Join(c.cfg.StateDir, "paused", id+".json")
}

func (c *Cluster) savePausedRecord(sb *Sandbox) error {
	if c.cfg.StateDir == "" {
		return nil
	}
	b, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	p := c.pausedRecordPath(sb.ID)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

func (c *Cluster) removePausedRecord(id string) {
	if c.cfg.StateDir != "" {
		os.Remove(c.pausedRecordPath(id))
	}
}

// loadPaused brings back the paused sandboxes of an earlier run whose
// snapshots still exist.
func (c *Cluster) loadPaused() {
	if c.cfg.StateDir == "" {
		return
	}
	files, _ := filepath.Glob(filepath.Join(c.cfg.StateDir, "paused", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var sb Sandbox
		if err := json.Unmarshal(b, &sb); err != nil || sb.State != StatePaused {
			c.log.Warn("ignoring unreadable paused sandbox record", "file", f, "err", err)
			continue
		}
		if _, err := c.cfg.Node.GetSnapshot(context.Background(), sb.SnapshotID); err != nil {
			c.log.Warn("paused sandbox lost its snapshot; dropping it", "sandbox_id", sb.ID, "err", err)
			os.Remove(f)
			continue
		}
		c.records[sb.ID] = &record{sb: sb}
		c.log.Info("paused sandbox restored from disk", "sandbox_id", sb.ID)
	}
}

// TemplateUsers counts the sandboxes (running or paused) and snapshots that
// run on template templateID's root filesystem: while there are any, the
// template must not be deleted.
func (c *Cluster) TemplateUsers(ctx context.Context, templateID string) (int, error) {
	n := 0
	c.mu.Lock()
	for _, r := range c.records {
		if r.sb.TemplateID == templateID {
			n++
		}
	}
	c.mu.Unlock()
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
