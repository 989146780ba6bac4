// Package cluster is the control plane's model of the sandboxes it runs:
// their records (metadata, owners, deadlines), their placement on nodes and
// the timeouts that end them. The api package drives it; it drives nodes.
// The records live in the state store (etcd), never only in this process:
// a restarted server finds every sandbox where it left it, and the
// deadlines are enforced by whichever server wins the election. It reaches
// nodes only through the node API's interface (nodeapi.Node: the server's
// own node in-process, node agents across the network) and reads the node
// registry through membership; it never links the node itself. A file per
// operation: create, pause (and resume), fork, migrate, kill, deadlines,
// routing.
package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// Cluster tracks sandboxes. It is safe for concurrent use.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	recs  *records
	nodes *fleet

	mu     sync.Mutex
	closed bool
	// expiring holds the ids whose timeout this server is handling.
	expiring map[string]bool
	// starting counts, by API key, the sandboxes of creates and forks
	// under way on this server (withinQuota).
	starting map[string]int
	// leading is set while this server is the elected one (deadlines,
	// lost nodes, draining nodes).
	leading atomic.Bool

	// bg owns every goroutine the cluster starts; Close ends them.
	bg *tasks
}

// Open loads the records from the state store, moves legacy paused
// records into it, reconciles the records with the sandboxes the node
// runs (see reconcile) and starts following the store and campaigning to
// enforce deadlines. Close stops that.
func Open(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.State == nil || (cfg.Local == nil && cfg.Dial == nil) || cfg.Candidate == "" {
		return nil, errors.New("opening cluster: a state store, a node (local or remote) and a candidate name are required")
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TickInterval == 0 {
		cfg.TickInterval = 250 * time.Millisecond
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, recs: newRecords(cfg.State, cfg.DataKeys), expiring: map[string]bool{}, starting: map[string]int{}}
	if cfg.KilledRetention > 0 {
		c.recs.killedTTL = cfg.KilledRetention
	}
	c.nodes = newFleet(cfg.State, cfg.Local, cfg.Dial, cfg.Logger)
	c.nodes.onEvent = c.nodeEvent
	if err := c.migrateLegacy(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	rev, err := c.recs.load(ctx)
	if err != nil {
		return nil, err
	}
	c.log.Info("sandbox records loaded", "records", len(c.recs.m), "took_ms", time.Since(start).Milliseconds())
	if cfg.Local != nil {
		if err := c.reconcile(ctx, cfg.Local); err != nil {
			return nil, err
		}
	}
	c.bg = newTasks(ctx)
	if err := c.nodes.start(c.bg); err != nil {
		c.bg.close()
		return nil, err
	}
	c.bg.Go(func(ctx context.Context) {
		c.recs.follow(ctx, rev, func(err error) { c.log.Warn("following sandbox records", "err", err) })
	})
	c.bg.Go(c.campaign)
	return c, nil
}

// nodeEvent handles what a node reports on its own.
func (c *Cluster) nodeEvent(nodeID string, ev *nodev1.Event) {
	switch ev.Kind {
	case nodev1.Event_KIND_EXITED, nodev1.Event_KIND_OOM_KILLED:
		c.forget(nodeID, ev.SandboxId, ev.Reason)
	case nodev1.Event_KIND_DRAINING:
		if c.leading.Load() && c.nodes.beginEvacuation(nodeID) {
			if !c.bg.Go(func(ctx context.Context) { c.evacuate(ctx, nodeID) }) {
				c.nodes.endEvacuation(nodeID)
			}
		}
	case nodev1.Event_KIND_IDLE:
		// Every server hears it; the leader pauses, as it ends timed-out
		// sandboxes, at most expiryWorkers at once with those: the node
		// reports a sandbox again while it stays idle.
		if c.leading.Load() {
			c.beginEnding(ev.SandboxId, func(ctx context.Context) { c.pauseIdle(ctx, nodeID, ev.SandboxId, ev.Reason) })
		}
	case nodev1.Event_KIND_SYNC:
		if c.cfg.Local == nil || nodeID != c.cfg.Local.ID() {
			c.bg.Go(func(context.Context) { c.syncNode(nodeID) })
		}
	}
}

// forget drops the record of a sandbox that died on its own on node
// nodeID, leaving the reason for whoever asks for it. Every server hears
// it; the first one's removal wins, and a sandbox that lives on another
// node by now (resumed elsewhere) is not touched.
func (c *Cluster) forget(nodeID, id, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	removed, err := c.recs.removeIf(ctx, id, reason, func(r *record) bool {
		return r.NodeID == nodeID && r.State == StateRunning
	})
	if err != nil {
		c.log.Error("removing record of exited sandbox", "sandbox_id", id, "err", err)
	}
	if removed {
		c.log.Warn("sandbox ended on its own", "sandbox_id", id, "reason", reason)
	}
	c.gone(id, reason)
}

// gone tells OnGone that sandbox id no longer runs where it did, and why
// when it ended on its own.
func (c *Cluster) gone(id, reason string) {
	if c.cfg.OnGone != nil {
		c.cfg.OnGone(id, reason)
	}
}

// Limits returns the cluster's limits.
func (c *Cluster) Limits() Limits { return c.cfg.Limits }

// Leading reports whether this server is the elected one, which enforces
// deadlines and does the cluster's housekeeping.
func (c *Cluster) Leading() bool { return c.leading.Load() }

// StopMode says what Close does with running sandboxes (membership's:
// the node agents' too).
type StopMode = membership.StopMode

// Stop modes.
const (
	// StopKeep leaves them running and recorded, for the next server.
	StopKeep = membership.StopKeep
	// StopPause pauses each one first (a host that is going away).
	StopPause = membership.StopPause
	// StopKill kills each one and removes its record.
	StopKill = membership.StopKill
)

// Close stops following the store and campaigning; the cluster accepts no
// creates afterwards. What happens to the node's running sandboxes is
// mode's.
func (c *Cluster) Close(ctx context.Context, mode StopMode) error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	var errs []error
	if mode != StopKeep && c.cfg.Local != nil {
		self := c.cfg.Local.ID()
		for _, r := range c.recs.matching(func(r *record) bool { return r.State == StateRunning && r.NodeID == self }) {
			var err error
			if mode == StopPause {
				if err = c.Pause(ctx, r.ID); err != nil {
					c.log.Warn("pausing sandbox on stop failed; it keeps running", "sandbox_id", r.ID, "err", err)
				} else {
					c.log.Info("sandbox paused on stop", "sandbox_id", r.ID)
				}
				continue
			}
			if err = c.Kill(ctx, r.ID); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
		}
	}
	c.nodes.stopAll()
	c.bg.close()
	return errors.Join(errs...)
}
