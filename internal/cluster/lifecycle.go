package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sync/errgroup"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
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
	return c.PauseWith(ctx, id, PauseOptions{})
}

// PauseOptions tune PauseWith.
type PauseOptions struct {
	// FilesOnly keeps the sandbox's files, not its memory (E2B's pause
	// with memory: false): its resume boots afresh with them.
	FilesOnly bool
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
	return c.finishPause(context.WithoutCancel(ctx), id, snap.Id)
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

// finishPause records that sandbox id is paused in snapshot snapID. A
// sandbox killed meanwhile takes its snapshot with it.
func (c *Cluster) finishPause(ctx context.Context, id, snapID string) error {
	_, err := c.recs.mutate(ctx, id, func(r *record) error {
		r.State = StatePaused
		r.SnapshotID = snapID
		r.PausedAt = time.Now().UTC()
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
	p := placement{memoryMB: r.MemoryMB, cpus: r.CPUCount, prefer: r.NodeID}
	if len(r.Mounts) > 0 {
		p.only = r.NodeID // where its volumes are
	}
	if snap, err := c.GetSnapshotAny(ctx, r.SnapshotID); err == nil {
		p.runtime, p.runtimeVersion = snap.Runtime, snap.RuntimeVersion
	}
	nsb, n, err := c.start(ctx, p, &nodev1.CreateRequest{
		SandboxId:     id,
		TemplateId:    r.SnapshotID,
		AllowInternet: r.AllowInternet,
		AllowOut:      r.AllowOut,
		DenyOut:       r.DenyOut,
		Reboot:        opts.Reboot,
	})
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
	var oldSnap string
	r, err := c.recs.mutate(ctx, id, func(r *record) error {
		oldSnap = r.SnapshotID
		r.State = StateRunning
		r.PausedAt = time.Time{}
		r.SnapshotID = ""
		r.Addr = addr
		r.EndAt = end
		r.NodeID = n.ID()
		r.clearOp()
		return nil
	})
	if err != nil {
		// Killed while it resumed: the sandbox must not run unrecorded.
		if _, kerr := n.Kill(ctx, &nodev1.KillRequest{SandboxId: id}); kerr != nil && nodeapi.Code(kerr) != connect.CodeNotFound {
			c.log.Error("killing resumed sandbox without a record", "sandbox_id", id, "err", kerr)
		}
		return nil, fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	// Removing a large image takes a while; the caller need not wait.
	go c.deleteSnapshotQuietly(oldSnap, "consumed pause snapshot")
	return &r.Sandbox, nil
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
func (c *Cluster) Fork(ctx context.Context, id string, count int, timeout time.Duration, owner Owner) ([]ForkResult, error) {
	if count < 1 || count > MaxForkCount {
		return nil, fmt.Errorf("%w: count must be between 1 and %d", ErrInvalid, MaxForkCount)
	}
	if timeout <= 0 || timeout > c.cfg.Limits.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1s and %s", ErrInvalid, c.cfg.Limits.MaxTimeout)
	}
	if err := c.withinQuota(owner, count); err != nil {
		return nil, err
	}
	r, err := c.claim(ctx, id, StateRunning, "fork")
	if err != nil {
		return nil, err
	}
	parent := r.Sandbox
	// The children are the parent's team's, whoever asks (an admin
	// may), and count against its quota.
	childIDs := make([]string, count)
	for i := range childIDs {
		childIDs[i] = ids.New()
	}
	if _, err := c.reserveRunning(ctx, parent.TeamID(), childIDs...); err != nil {
		c.release(ctx, id, "fork")
		return nil, err
	}
	defer c.releaseUnstarted(ctx, parent.TeamID(), childIDs)
	snap, err := c.snapshotOn(ctx, r.NodeID, &nodev1.SnapshotRequest{SandboxId: id, Kind: string(snapshot.KindFork)})
	c.release(ctx, id, "fork")
	if err != nil {
		return nil, err
	}
	defer func() { go c.deleteSnapshotQuietly(snap.Id, "fork snapshot") }()
	// Children start beside their source, whose node has the state at
	// hand; when it is full they go where there is room, restoring from
	// the store.
	p := placement{memoryMB: parent.MemoryMB, cpus: parent.CPUCount, prefer: parent.NodeID,
		runtime: snap.Runtime, runtimeVersion: snap.RuntimeVersion}
	if len(parent.Mounts) > 0 {
		p.only = parent.NodeID // children mount the same volumes
	}

	results := make([]ForkResult, count)
	sem := make(chan struct{}, forkParallelism)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			nsb, n, err := c.start(ctx, p, &nodev1.CreateRequest{
				SandboxId:     childIDs[i],
				TemplateId:    snap.Id,
				AllowInternet: parent.AllowInternet,
				AllowOut:      parent.AllowOut,
				DenyOut:       parent.DenyOut,
			})
			if err != nil {
				results[i].Err = err
				return
			}
			sb, err := c.register(ctx, n, nsb, registration{
				requestedTemplate: parent.TemplateID, metadata: parent.Metadata, timeout: timeout,
				autoPause: parent.AutoPause, autoPauseFilesOnly: parent.AutoPauseFilesOnly, autoResume: parent.AutoResume,
				allowInternet: parent.AllowInternet, keyID: owner.KeyID, team: parent.TeamID(),
				privateTraffic: parent.TrafficAccessToken != "", mounts: parent.Mounts,
				network: NetworkRules{AllowOut: parent.AllowOut, DenyOut: parent.DenyOut, MaskRequestHost: parent.MaskRequestHost},
			})
			results[i] = ForkResult{Sandbox: sb, Err: err}
		}()
	}
	wg.Wait()
	return results, nil
}

// releaseUnstarted gives back the reservations of a fork's children that
// did not start.
func (c *Cluster) releaseUnstarted(ctx context.Context, team string, childIDs []string) {
	if c.teamLimits(team).MaxSandboxes <= 0 {
		return
	}
	var failed []string
	for _, id := range childIDs {
		if !c.recs.has(id) {
			failed = append(failed, id)
		}
	}
	if len(failed) > 0 {
		c.releaseSlots(context.WithoutCancel(ctx), team, failed)
	}
}

func (c *Cluster) deleteSnapshotQuietly(id, what string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := c.deleteSnapshot(ctx, id); err != nil {
		c.log.Warn("deleting "+what, "snapshot_id", id, "err", err)
	}
}

// The snapshot catalog is the store's, which every node shares (without
// a store, the local node's own): any node answers for it.

func (c *Cluster) deleteSnapshot(ctx context.Context, id string) error {
	n, err := c.nodes.any()
	if err != nil {
		return err
	}
	if _, err := n.DeleteSnapshot(ctx, &nodev1.DeleteSnapshotRequest{Id: id}); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	return nil
}

// snapshots lists the snapshots of the given kinds (all when none).
func (c *Cluster) snapshots(ctx context.Context, kinds ...snapshot.Kind) ([]*snapshot.Snapshot, error) {
	n, err := c.nodes.any()
	if err != nil {
		return nil, err
	}
	req := &nodev1.ListSnapshotsRequest{}
	for _, k := range kinds {
		req.Kinds = append(req.Kinds, string(k))
	}
	resp, err := n.ListSnapshots(ctx, req)
	if err != nil {
		return nil, fmt.Errorf("listing snapshots: %w", err)
	}
	out := make([]*snapshot.Snapshot, len(resp.Snapshots))
	for i, w := range resp.Snapshots {
		out[i] = nodeapi.SnapshotFromWire(w)
	}
	return out, nil
}

// GetSnapshotAny returns a snapshot of any kind by id or name.
func (c *Cluster) GetSnapshotAny(ctx context.Context, idOrName string) (*snapshot.Snapshot, error) {
	n, err := c.nodes.any()
	if err != nil {
		return nil, err
	}
	w, err := n.GetSnapshot(ctx, &nodev1.GetSnapshotRequest{IdOrName: idOrName})
	if nodeapi.Code(err) == connect.CodeNotFound {
		return nil, fmt.Errorf("%w: snapshot %q", ErrNotFound, idOrName)
	}
	if err != nil {
		return nil, fmt.Errorf("looking up snapshot %q: %w", idOrName, err)
	}
	return nodeapi.SnapshotFromWire(w), nil
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
	snaps, err := c.snapshots(ctx)
	if err != nil {
		return 0, err
	}
	for _, s := range snaps {
		// A template's own started service goes with it.
		if s.TemplateID == templateID && s.Kind != snapshot.KindTemplate {
			n++
		}
	}
	return n, nil
}

// DeleteTemplateSnapshots deletes the snapshots of a deleted template's
// started service.
func (c *Cluster) DeleteTemplateSnapshots(ctx context.Context, templateID string) error {
	snaps, err := c.snapshots(ctx, snapshot.KindTemplate)
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range snaps {
		if s.TemplateID != templateID {
			continue
		}
		if err := c.deleteSnapshot(ctx, s.ID); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

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
func (c *Cluster) Migrate(ctx context.Context, id, target string) (*Migration, error) {
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
	p := placement{memoryMB: r.MemoryMB, cpus: r.CPUCount, exclude: []string{from}, only: target}
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
	// fails, it must end up running somewhere or recorded as paused.
	ctx = context.WithoutCancel(ctx)
	req := &nodev1.CreateRequest{SandboxId: id, TemplateId: snap.Id, AllowInternet: r.AllowInternet,
		AllowOut: r.AllowOut, DenyOut: r.DenyOut}
	// Its volumes go along (through the store), before it starts there.
	rerr := c.moveVolumes(ctx, r.Mounts, from, dest)
	var nsb *nodev1.Sandbox
	if rerr == nil {
		nsb, rerr = dest.Create(ctx, req)
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
			if err := c.finishPause(ctx, id, snap.Id); err != nil {
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
	go c.deleteSnapshotQuietly(snap.Id, "migration snapshot")
	down := time.Since(start)
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
// closing), it leaves the sandbox as it is.
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

// resumeWait bounds how long traffic to a paused sandbox waits for the
// resume it caused (or another request's).
const resumeWait = time.Minute

// AutoResume resumes paused sandbox id for traffic that reached it, if it
// asked for that (lifecycle.autoResume), with the timeout it was created
// with; a resume already under way (another request's) is waited for. It
// reports whether the sandbox runs now.
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
		if !sb.AutoResume {
			return false, nil
		}
		timeout := sb.Timeout
		if timeout <= 0 || timeout > c.cfg.Limits.MaxTimeout {
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
