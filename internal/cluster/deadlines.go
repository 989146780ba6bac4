package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// electionName is the election whose winner enforces deadlines: exactly
// one server at a time pauses or kills sandboxes whose timeout passed, so
// that two servers never race to end the same sandbox, and a deadline that
// passed while no server ran is enforced by the first one back.
const electionName = "deadlines"

// leaderTTL is the lease of the leader's session: a leader that dies
// without resigning is replaced within about this long.
const leaderTTL = 10 * time.Second

// sweepEvery is how often the leader removes expired tombstones.
const sweepEvery = time.Minute

// orphansEvery is how often the leader looks for the running sandboxes of
// lost nodes.
const orphansEvery = time.Second

// campaign runs for election until ctx ends; while this server leads it
// enforces deadlines.
func (c *Cluster) campaign(ctx context.Context) {
	backoff := time.Second
	for ctx.Err() == nil {
		err := c.leadOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			c.log.Warn("deadline election", "err", err, "retry_in", backoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// leadOnce waits to win the election, then enforces deadlines until the
// leadership or ctx ends.
func (c *Cluster) leadOnce(ctx context.Context) error {
	sess, err := c.cfg.State.NewSession(ctx, leaderTTL)
	if err != nil {
		return err
	}
	defer sess.Close(context.WithoutCancel(ctx))
	// A candidacy under our name is an earlier process of this server that
	// died (kill -9, a crash) still leading: waiting out its lease would
	// leave deadlines unenforced for that long after a restart.
	if err := c.cfg.State.Evict(ctx, electionName, c.cfg.Candidate); err != nil {
		return err
	}
	lead, err := c.cfg.State.Campaign(ctx, sess, electionName, c.cfg.Candidate)
	if err != nil {
		return err
	}
	c.log.Info("this server now enforces sandbox deadlines", "candidate", c.cfg.Candidate)
	c.leading.Store(true)
	defer c.leading.Store(false)
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		lead.Resign(rctx)
		cancel()
	}()
	tick := time.NewTicker(c.cfg.TickInterval)
	defer tick.Stop()
	lastSweep, lastOrphans := time.Time{}, time.Time{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-lead.Done():
			return errors.New("lost leadership")
		case <-tick.C:
		}
		c.expireDue(ctx)
		paused := c.List(ListFilter{States: []State{StatePaused}})
		c.expireIdlePaused(ctx, paused)
		c.reclaimPaused(ctx, paused)
		if time.Since(lastOrphans) > orphansEvery {
			lastOrphans = time.Now()
			c.loseOrphanedRecords(ctx)
		}
		if time.Since(lastSweep) > sweepEvery {
			lastSweep = time.Now()
			c.sweepTombstones(ctx)
			c.sweepIdempotency(ctx)
		}
	}
}

// expiryWorkers bounds the sandboxes being ended for their deadline at
// once: a thousand due in the same tick are ended eight at a time, the
// rest from the next ticks on, not by a thousand goroutines at once.
const expiryWorkers = 8

// expireDue starts ending the running sandboxes whose deadline passed, as
// many as expiryWorkers allows alongside those still being ended.
func (c *Cluster) expireDue(ctx context.Context) {
	for _, id := range c.recs.due(time.Now()) {
		if !c.beginEnding(id, func(ctx context.Context) { c.expire(ctx, id) }) {
			return
		}
	}
}

// beginEnding runs end (a pause or kill of sandbox id) in the background
// unless one is under way for id already, or expiryWorkers are; it
// reports false when no more can start now.
func (c *Cluster) beginEnding(id string, end func(context.Context)) bool {
	c.mu.Lock()
	busy, full := c.expiring[id], len(c.expiring) >= expiryWorkers
	if !busy && !full {
		c.expiring[id] = true
	}
	c.mu.Unlock()
	if full {
		return false
	}
	if busy {
		return true
	}
	done := func() {
		c.mu.Lock()
		delete(c.expiring, id)
		c.mu.Unlock()
	}
	started := c.bg.Go(func(ctx context.Context) {
		defer done()
		// Once begun, a pause or kill finishes even if this server
		// stops leading meanwhile (Close waits for it).
		end(context.WithoutCancel(ctx))
	})
	if !started {
		done()
	}
	return started
}

// pauseIdle pauses sandbox id, which node nodeID reports idle for reason,
// if it still runs there: its next request resumes it.
func (c *Cluster) pauseIdle(ctx context.Context, nodeID, id, reason string) {
	sb, err := c.Get(ctx, id)
	if err != nil || sb.State != StateRunning || sb.NodeID != nodeID {
		return
	}
	err = c.PauseWith(ctx, id, PauseOptions{Idle: true})
	switch {
	case err == nil:
		c.log.Info("idle sandbox paused; its next request resumes it", "sandbox_id", id, "node_id", nodeID, "reason", reason)
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict):
		// Gone, or busy with another operation: not idle after all.
	default:
		c.log.Warn("pausing an idle sandbox", "sandbox_id", id, "node_id", nodeID, "reason", reason, "err", err)
	}
}

// expireIdlePaused ends the sandboxes paused for being idle whose deadline
// passed while they were: as the timeout would have ended them running,
// one that asked to pause on timeout stays paused as its owner's (its
// traffic resumes it only if it asked for that), the others are killed.
func (c *Cluster) expireIdlePaused(ctx context.Context, paused []*Sandbox) {
	now := time.Now()
	for _, sb := range paused {
		if !sb.IdlePaused || now.Before(sb.EndAt) {
			continue
		}
		if sb.AutoPause {
			_, err := c.recs.mutate(ctx, sb.ID, func(r *record) error {
				if r.State != StatePaused || r.Op != "" {
					return ErrConflict
				}
				r.IdlePaused = false
				return nil
			})
			if err == nil {
				c.log.Info("idle-paused sandbox timed out; it stays paused", "sandbox_id", sb.ID)
			}
			continue
		}
		c.log.Info("idle-paused sandbox timed out", "sandbox_id", sb.ID)
		if err := c.Kill(ctx, sb.ID); err != nil && !errors.Is(err, ErrNotFound) {
			c.log.Warn("killing a timed-out idle-paused sandbox", "sandbox_id", sb.ID, "err", err)
		}
	}
}

// expire ends a sandbox whose deadline passed (unless it moved meanwhile):
// it pauses it when it asked for that, else kills it.
func (c *Cluster) expire(ctx context.Context, id string) {
	sb, err := c.Get(ctx, id)
	if err != nil || sb.State != StateRunning || time.Now().Before(sb.EndAt) {
		return
	}
	if sb.AutoPause {
		c.log.Info("sandbox timed out; pausing it", "sandbox_id", id)
		err := c.PauseWith(ctx, id, PauseOptions{FilesOnly: sb.AutoPauseFilesOnly})
		if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) {
			return
		}
		c.log.Warn("pausing timed-out sandbox failed; killing it", "sandbox_id", id, "err", err)
	}
	c.log.Info("sandbox timed out", "sandbox_id", id)
	if err := c.Kill(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
		c.log.Warn("killing timed-out sandbox", "sandbox_id", id, "err", err)
	}
}

// sweepTombstones removes the reasons of sandboxes lost over a day ago.
func (c *Cluster) sweepTombstones(ctx context.Context) {
	entries, _, err := c.cfg.State.List(ctx, tombstonePrefix)
	if err != nil {
		c.log.Warn("listing tombstones", "err", err)
		return
	}
	for _, e := range entries {
		var t tombstone
		if json.Unmarshal(e.Value, &t) == nil && !t.expired(time.Now()) {
			continue
		}
		if err := c.cfg.State.Delete(ctx, e.Key, e.Revision); err != nil {
			c.log.Debug("removing tombstone", "sandbox_id", strings.TrimPrefix(e.Key, tombstonePrefix), "err", err)
		}
	}
}

// reclaimPaused deletes the paused sandboxes kept past the retention,
// with their snapshots.
func (c *Cluster) reclaimPaused(ctx context.Context, paused []*Sandbox) {
	keep := c.cfg.PausedRetention
	if keep <= 0 {
		return
	}
	for _, sb := range paused {
		if sb.PausedAt.IsZero() || time.Since(sb.PausedAt) < keep {
			continue
		}
		if err := c.Kill(ctx, sb.ID); err != nil && !errors.Is(err, ErrNotFound) {
			c.log.Warn("reclaiming a paused sandbox past the retention", "sandbox_id", sb.ID, "err", err)
			continue
		}
		c.log.Info("paused sandbox reclaimed: it was kept past the paused retention", "sandbox_id", sb.ID,
			"paused_at", sb.PausedAt, "retention", keep, "snapshot_id", sb.SnapshotID)
	}
}

// SetTimeout moves a sandbox's deadline to now + d.
func (c *Cluster) SetTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	return c.extend(ctx, id, d, false)
}

// Refresh moves a sandbox's deadline to now + d unless it is already later.
func (c *Cluster) Refresh(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	return c.extend(ctx, id, d, true)
}

func (c *Cluster) extend(ctx context.Context, id string, d time.Duration, onlyLater bool) (*Sandbox, error) {
	if d <= 0 || d > c.cfg.Limits.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1s and %s", ErrInvalid, c.cfg.Limits.MaxTimeout)
	}
	r, err := c.recs.mutate(ctx, id, func(r *record) error {
		if r.State != StateRunning {
			return fmt.Errorf("%w: sandbox %s is %s (connect resumes it)", ErrConflict, id, r.State)
		}
		end := time.Now().UTC().Add(d)
		if onlyLater && end.Before(r.EndAt) {
			return errUnchanged
		}
		r.EndAt = end
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, c.notFound(ctx, id)
		}
		return nil, err
	}
	return &r.Sandbox, nil
}
