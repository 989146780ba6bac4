package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/state"
)

// resumedGrace is the least time a sandbox whose resume a restart cut
// short gets before its deadline, so that its client can reconnect.
const resumedGrace = 5 * time.Minute

// reconcile brings the records of this node's sandboxes and what the node
// really runs (after a restart: what it recovered) into agreement, and
// finishes or rolls back the operations a kill -9 cut short:
//
//   - a running record whose sandbox runs: kept; a cut-short snapshot,
//     fork or pause that left it running is rolled back.
//   - a running record whose sandbox is gone: if a pause was under way
//     and its snapshot is complete, the pause is finished; otherwise the
//     sandbox is lost: the record goes, and for a day its id answers with
//     the reason.
//   - a paused record whose sandbox runs here: its resume got as far as
//     the restore, so the resume is finished.
//   - a sandbox the node runs without any record (a create cut short
//     before it was recorded): killed.
func (c *Cluster) reconcile(ctx context.Context, n nodeapi.Node) error {
	self := n.ID()
	list, err := n.List(ctx, &nodev1.ListRequest{})
	if err != nil {
		return fmt.Errorf("reconciling sandbox records: listing node %s: %w", self, err)
	}
	running := map[string]*nodev1.Sandbox{}
	for _, sb := range list.Sandboxes {
		running[sb.Id] = sb
	}
	var errs []error
	// Other nodes' running sandboxes are theirs to reconcile.
	for _, r := range c.recs.matching(func(r *record) bool { return r.State != StateRunning || r.NodeID == self }) {
		nsb, runs := running[r.ID]
		delete(running, r.ID)
		switch {
		case r.State == StateRunning && runs:
			if r.Op != "" {
				c.log.Info("operation cut short by a restart; the sandbox kept running", "sandbox_id", r.ID, "op", r.Op)
				c.release(ctx, r.ID, r.Op)
			}
			if r.Op == "pause" {
				// The pause may have saved its state before the restart
				// cut it short; the sandbox runs on, so that state goes.
				if snap := c.pauseSnapshotOf(ctx, r.ID); snap != "" {
					c.deleteSnapshotQuietly(snap, "pause snapshot of a sandbox that runs on")
				}
			}
		case r.State == StateRunning && r.Op == "pause":
			if snap := c.pauseSnapshotOf(ctx, r.ID); snap != "" {
				c.log.Info("finishing a pause cut short by a restart", "sandbox_id", r.ID, "snapshot_id", snap)
				errs = append(errs, c.finishPause(ctx, r.ID, snap, false))
				continue
			}
			errs = append(errs, c.lose(ctx, r, "the server stopped while pausing it, before its state was saved"))
		case r.State == StateRunning:
			errs = append(errs, c.lose(ctx, r, fmt.Sprintf("it was not running when node %s restarted", self)))
		case r.State == StatePaused && runs:
			c.log.Info("finishing a resume cut short by a restart", "sandbox_id", r.ID)
			end := time.Now().UTC().Add(resumedGrace)
			if r.EndAt.After(end) {
				end = r.EndAt
			}
			addr, _ := netip.ParseAddr(nsb.Addr)
			if _, err := c.finishResume(ctx, n, r.ID, addr, end); err != nil {
				errs = append(errs, err)
			}
		case r.State == StatePaused && r.Op != "":
			c.release(ctx, r.ID, r.Op)
		}
	}
	for id := range running {
		c.log.Warn("removing a sandbox without a record (its create was cut short)", "sandbox_id", id)
		if _, err := n.Kill(ctx, &nodev1.KillRequest{SandboxId: id}); err != nil && !errors.Is(err, nodeapi.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	c.dropForkSnapshots(ctx)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reconciling sandbox records: %w", err)
	}
	return nil
}

// orphanRecheck is how long a server that found a sandbox without a
// record on a node waits before it looks again and removes it: one that
// was just created has its record written within milliseconds.
const orphanRecheck = 5 * time.Second

// syncNode brings the records of a remote node's sandboxes and what it
// runs into agreement, when this server (re)connects to its events: a
// node that restarted within its lease keeps what it recovered; one that
// came back with less had sandboxes lost; what it runs that no record
// names any more (its sandboxes were reported lost while it was away) is
// removed. Records in the middle of an operation are left to it.
func (c *Cluster) syncNode(nodeID string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := c.nodes.node(nodeID)
	if err != nil {
		return
	}
	list, err := n.List(ctx, &nodev1.ListRequest{})
	if err != nil {
		c.log.Warn("listing a node's sandboxes", "node_id", nodeID, "err", err)
		return
	}
	running := map[string]*nodev1.Sandbox{}
	for _, sb := range list.Sandboxes {
		running[sb.Id] = sb
	}
	// Only this node's records are looked at: a server syncs with every
	// node it connects to, and copying every record each time would cost
	// nodes x records.
	var gone []record
	c.recs.each(func(r *record) {
		if r.NodeID != nodeID {
			return
		}
		if _, runs := running[r.ID]; !runs && r.State == StateRunning && r.Op == "" {
			gone = append(gone, *r)
		}
	})
	for id := range running {
		if _, _, _, _, known := c.recs.route(id); known {
			delete(running, id) // recorded, here or (resumed) elsewhere: not an orphan
		}
	}
	for _, r := range gone {
		if err := c.lose(ctx, r, fmt.Sprintf("it was not running when node %s came back", nodeID)); err != nil {
			c.log.Warn("recording a lost sandbox", "sandbox_id", r.ID, "err", err)
		}
	}
	if len(running) == 0 {
		return
	}
	select {
	case <-time.After(orphanRecheck):
	case <-ctx.Done():
		return
	}
	for id := range running {
		if _, _, err := c.recs.fetch(ctx, id); !errors.Is(err, state.ErrNotFound) {
			continue // recorded meanwhile, or the store cannot say
		}
		c.log.Warn("removing a sandbox its node runs without a record (reported lost while the node was away)", "sandbox_id", id, "node_id", nodeID)
		if _, err := n.Kill(ctx, &nodev1.KillRequest{SandboxId: id}); err != nil && !errors.Is(err, nodeapi.ErrNotFound) {
			c.log.Warn("removing an orphaned sandbox", "sandbox_id", id, "node_id", nodeID, "err", err)
		}
	}
}

// lostGrace is how long after a node's lease expired its running
// sandboxes are reported lost: a node whose lease lapsed for a moment (a
// store failover) re-registers within it.
const lostGrace = 3 * time.Second

// loseOrphanedRecords reports lost the running sandboxes of nodes whose
// lease expired (the deadline leader does this, once). A record in the
// middle of an operation is left to the server doing it, which fails
// against the dead node and clears its mark.
func (c *Cluster) loseOrphanedRecords(ctx context.Context) {
	isLost := c.nodes.lostBefore(time.Now().Add(-lostGrace))
	var lost []record
	c.recs.each(func(r *record) {
		if r.State != StateRunning || (r.Op != "" && time.Since(r.OpSince) < staleOp) {
			return
		}
		if isLost(r.NodeID) {
			lost = append(lost, *r)
		}
	})
	for _, r := range lost {
		if err := c.lose(ctx, r, fmt.Sprintf("its node %s stopped answering (its lease expired)", r.NodeID)); err != nil {
			c.log.Warn("recording a lost sandbox", "sandbox_id", r.ID, "err", err)
		}
		c.gone(r.ID, fmt.Sprintf("its node %s stopped answering", r.NodeID))
	}
}

// lose removes the record of a sandbox that no longer exists, leaving why.
// Only a record still as seen (same node, state and operation) is
// removed: one that moved on meanwhile is not lost.
func (c *Cluster) lose(ctx context.Context, seen record, why string) error {
	removed, err := c.recs.removeIf(ctx, seen.ID, "sandbox lost: "+why, func(r *record) bool {
		return r.NodeID == seen.NodeID && r.State == seen.State && r.Op == seen.Op
	})
	if removed {
		c.log.Warn("sandbox lost", "sandbox_id", seen.ID, "reason", why)
	}
	return err
}

// pauseSnapshotOf returns the newest complete pause snapshot of sandbox
// id, or "".
func (c *Cluster) pauseSnapshotOf(ctx context.Context, id string) string {
	snaps, err := c.snapshots(ctx, snapshot.KindPause)
	if err != nil {
		return ""
	}
	var best *snapshot.Snapshot
	for _, s := range snaps {
		if s.SandboxID == id && (best == nil || s.CreatedAt.After(best.CreatedAt)) {
			best = s
		}
	}
	if best == nil {
		return ""
	}
	return best.ID
}

// dropForkSnapshots removes the transient snapshots of forks a restart cut
// short; a fork in progress holds its own for seconds, not this long.
func (c *Cluster) dropForkSnapshots(ctx context.Context) {
	snaps, err := c.snapshots(ctx, snapshot.KindFork)
	if err != nil {
		return
	}
	for _, s := range snaps {
		if time.Since(s.CreatedAt) > staleOp {
			c.deleteSnapshotQuietly(s.ID, "fork snapshot left by a restart")
		}
	}
}

// migrateLegacy moves the paused-sandbox records that servers before the
// state store kept as files into the store, once: each file is removed
// only after its record is stored (or found already there).
func (c *Cluster) migrateLegacy(ctx context.Context) error {
	if c.cfg.LegacyStateDir == "" {
		return nil
	}
	files, _ := filepath.Glob(filepath.Join(c.cfg.LegacyStateDir, "paused", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("migrating paused record %s: %w", f, err)
		}
		// Old records are the Sandbox struct of then without JSON tags;
		// its field names match storedRecord's case-insensitively.
		var s storedRecord
		err = json.Unmarshal(b, &s)
		r := fromStored(&s)
		if err != nil || r.State != StatePaused || r.ID == "" {
			c.log.Warn("ignoring unreadable paused sandbox record", "file", f, "err", err)
			os.Rename(f, f+".unreadable")
			continue
		}
		if _, err := c.GetSnapshotAny(ctx, r.SnapshotID); errors.Is(err, ErrNotFound) {
			c.log.Warn("paused sandbox lost its snapshot; dropping it", "sandbox_id", r.ID, "err", err)
			os.Remove(f)
			continue
		} else if err != nil {
			// The file stays for the next start to try again.
			return fmt.Errorf("migrating paused record %s: %w", f, err)
		}
		if err := c.recs.create(ctx, r); err != nil && !errors.Is(err, state.ErrExists) {
			return fmt.Errorf("migrating paused record %s: %w", f, err)
		}
		os.Remove(f)
		c.log.Info("paused sandbox record moved into the state store", "sandbox_id", r.ID)
	}
	return nil
}
