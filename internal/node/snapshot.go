package node

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/aenvhq/aenv/internal/capacity"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/template"
)

// ErrUnsupported is returned when the runtime or configuration cannot do
// what was asked.
var ErrUnsupported = errors.New("not supported")

// SnapshotOptions tune Snapshot.
type SnapshotOptions struct {
	// Kind is what the snapshot is for.
	Kind snapshot.Kind
	// Names are user-facing names that resolve to the snapshot.
	Names []string
	// Stop ends the sandbox once its state is saved (pause); its CPU,
	// memory and network are released.
	Stop bool
	// FilesOnly saves the sandbox's files without its memory (E2B's pause
	// with memory: false); it needs Stop. Its restore boots afresh.
	FilesOnly bool
}

// Snapshot saves the whole state of a running sandbox (memory, processes,
// files) as a new snapshot. Without Stop the sandbox keeps running; a
// failed snapshot leaves it as it was and no snapshot behind.
func (n *Node) Snapshot(ctx context.Context, id string, opts SnapshotOptions) (*snapshot.Snapshot, error) {
	sb, err := n.Get(id)
	if err != nil {
		return nil, err
	}
	return n.snapshotSandbox(ctx, sb, opts)
}

// snapshotSandbox is Snapshot of a sandbox in hand (registered or not).
func (n *Node) snapshotSandbox(ctx context.Context, sb *Sandbox, opts SnapshotOptions) (*snapshot.Snapshot, error) {
	cp, ok := n.cfg.Runtime.(runtime.Checkpointer)
	if !ok || n.cfg.Snapshots == nil {
		return nil, fmt.Errorf("snapshotting sandbox %s: runtime %s: %w", sb.ID, n.cfg.Runtime.Name(), ErrUnsupported)
	}
	id := sb.ID
	start := time.Now()
	snap := &snapshot.Snapshot{
		ID:              NewID(),
		Names:           opts.Names,
		Kind:            opts.Kind,
		SandboxID:       id,
		TemplateID:      sb.TemplateID,
		RootImage:       sb.RootImage,
		CPUCount:        sb.CPUCount,
		MemoryMB:        sb.MemoryMB,
		DiskMB:          sb.DiskMB,
		EnvdVersion:     sb.EnvdVersion,
		EnvdAccessToken: sb.EnvdAccessToken,
		Runtime:         n.cfg.Runtime.Name(),
		RuntimeVersion:  n.cfg.RuntimeVersion,
		WritableMB:      max(sb.DiskMB, 0),
		Mounts:          sb.Mounts,
	}
	if opts.Kind == snapshot.KindPause {
		// For a resume that boots afresh (its memory, which holds them
		// too, is then not restored).
		n.mu.Lock()
		snap.EnvVars = maps.Clone(sb.envVars)
		n.mu.Unlock()
	}
	if sb.TemplateID == template.BaseID && snap.RootImage != "" {
		// Before the sandbox is frozen: the first publish reads the
		// whole image.
		if err := n.cfg.Templates.PublishBaseImage(ctx, snap.RootImage); err != nil {
			return nil, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
		}
	}
	dir, err := n.cfg.Snapshots.Begin(snap.ID)
	if err != nil {
		return nil, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	if opts.FilesOnly {
		return n.snapshotFiles(ctx, sb, snap, dir, start)
	}
	// A pause freezes the sandbox rather than stopping it, and ends it
	// only once its state is committed: a failed save leaves it running.
	stopWriteback := n.cfg.Snapshots.StartWriteback(snap)
	err = cp.Checkpoint(ctx, sb.rt(), dir, runtime.CheckpointOptions{LeaveRunning: !opts.Stop, Freeze: opts.Stop})
	stopWriteback()
	if err != nil {
		n.cfg.Snapshots.Abort(snap.ID)
		return nil, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	saved := time.Now()
	if err := n.cfg.Snapshots.Commit(ctx, snap); err != nil {
		n.cfg.Snapshots.Abort(snap.ID)
		if opts.Stop {
			if terr := cp.Thaw(context.WithoutCancel(ctx), sb.rt()); terr != nil {
				n.unregister(id)
				n.destroy(context.WithoutCancel(ctx), sb)
				n.notifyExit(id, "its state could not be saved while it was being paused")
				return nil, fmt.Errorf("snapshotting sandbox %s: %w (and it could not run on: %v)", id, err, terr)
			}
			n.log.Warn("pause failed; the sandbox runs on", "sandbox_id", id, "err", err)
		}
		return nil, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	if opts.Kind != snapshot.KindTemplate {
		n.logEvent(id, "info", "snapshot saved", "snapshot_id", snap.ID, "kind", string(snap.Kind),
			"size_bytes", strconv.FormatInt(snap.SizeBytes, 10))
	}
	if opts.Stop {
		n.unregister(id)
		// envd's last events join the history before it leaves the heap;
		// what ran the sandbox is released after.
		n.keepEnvdEvents(sb)
		n.releaseLater(sb)
		if opts.Kind != snapshot.KindTemplate {
			n.logEvent(id, "info", "sandbox stopped: its state is saved")
			n.historyEnded(id)
		}
	}
	n.log.Info("sandbox snapshotted", "sandbox_id", id, "snapshot_id", snap.ID, "kind", snap.Kind,
		"stopped", opts.Stop, "size_bytes", snap.SizeBytes,
		"checkpoint_ms", saved.Sub(start).Milliseconds(), "total_ms", time.Since(start).Milliseconds())
	return snap, nil
}

// restore starts a sandbox from a snapshot. The state, envd's included
// (environment, token, running processes), comes back as it was saved.
func (n *Node) restore(ctx context.Context, snap *snapshot.Snapshot, req CreateRequest) (*Sandbox, error) {
	if snap.FilesOnly {
		return n.restoreFiles(ctx, snap, req)
	}
	if req.Reboot {
		return n.reboot(ctx, snap, req)
	}
	if err := n.CanRestore(snap); err != nil {
		return nil, err
	}
	tpl, id, err := n.restoreTarget(ctx, snap, req)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	sb, err := n.boot(ctx, id, tpl, bootOptions{
		CPUCount: snap.CPUCount, MemoryMB: snap.MemoryMB, Network: req.Network, ImageDir: snap.Dir, RootImage: snap.RootImage,
		DiskMB: snap.WritableMB, Mounts: snap.Mounts,
	})
	if err != nil {
		return nil, fmt.Errorf("restoring snapshot %s: %w", snap.ID, err)
	}
	sb.EnvdAccessToken = snap.EnvdAccessToken
	if snap.EnvdAccessToken != "" && snap.Kind != snapshot.KindPause {
		// A new sandbox from a saved one (a fork's child, a create from
		// a snapshot) must not share its token with its siblings: each
		// gets one of its own, which envd takes from the old one's
		// holder, the node.
		fresh := randomToken()
		if err := newEnvdClient(sb.Addr, snap.EnvdAccessToken).init(ctx, initRequest{AccessToken: fresh, Timestamp: time.Now().UTC()}); err != nil {
			n.destroy(context.WithoutCancel(ctx), sb)
			return nil, fmt.Errorf("restoring snapshot %s: giving sandbox %s its own envd token: %w", snap.ID, id, err)
		}
		sb.EnvdAccessToken = fresh
	}
	n.register(ctx, sb, req.TeamID)
	n.log.Info("sandbox restored", "sandbox_id", id, "runtime_id", sb.rt(), "snapshot_id", snap.ID, "total_ms", time.Since(start).Milliseconds())
	n.logEvent(id, "info", "sandbox restored", "snapshot_id", snap.ID, "kind", string(snap.Kind),
		"took_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
	return sb, nil
}

// restoreTarget is what every restore of snap starts from: its template
// (fetched if this node lacks it) and the new sandbox's id.
func (n *Node) restoreTarget(ctx context.Context, snap *snapshot.Snapshot, req CreateRequest) (*template.Template, string, error) {
	tpl, err := n.template(ctx, snap.TemplateID)
	if err != nil {
		return nil, "", fmt.Errorf("restoring snapshot %s: its template: %w", snap.ID, err)
	}
	if snap.RootImage != "" && snap.RootImage != tpl.RootImage() {
		// The template changed since, or the snapshot was saved on
		// another host's base: the state goes back on the image it was
		// saved on, which the store keeps.
		switch stored := n.cfg.Templates.Stored(); {
		case tpl.ID == template.BaseID && !stored && len(snap.Mounts) > 0:
			// With volumes it ran with a gofer, which reads this
			// host's tree as well as its own.
		case tpl.ID == template.BaseID && !stored:
			return nil, "", fmt.Errorf("restoring snapshot %s: %w: it was saved on an image of base this host lacks (%s, another host's or one rebuilt since; this host's is %q), and this node has no store to read it from: give the nodes a store they share (--store), or run base with a gofer (--base-root-image=false)",
				snap.ID, ErrNoRootImage, snap.RootImage, tpl.BaseImage)
		default:
			old := *tpl
			old.BlockImage, old.ImageFile, old.BaseImage = snap.RootImage, "", ""
			if n.cfg.RootFS.Serves(&old) {
				tpl = &old
			}
		}
	}
	id := req.SandboxID
	if id == "" {
		id = NewID()
	}
	return tpl, id, nil
}

// CanRestore says whether this node's runtime can restore snap: the
// runtime and its version must be those that saved it (a snapshot from
// before they were recorded, or from an unstamped runsc, is taken to
// match: capacity.Restorable).
func (n *Node) CanRestore(snap *snapshot.Snapshot) error {
	rt := n.cfg.Runtime.Name()
	if snap.Runtime == "" || (snap.Runtime == rt && capacity.Restorable(snap.RuntimeVersion, n.cfg.RuntimeVersion)) {
		return nil
	}
	return fmt.Errorf("restoring snapshot %s: %w: it was saved by %s %s and this node runs %s %s",
		snap.ID, ErrIncompatible, snap.Runtime, snap.RuntimeVersion, rt, n.cfg.RuntimeVersion)
}

// Snapshots lists the snapshots of the given kinds.
func (n *Node) Snapshots(ctx context.Context, kinds ...snapshot.Kind) ([]*snapshot.Snapshot, error) {
	if n.cfg.Snapshots == nil {
		return nil, nil
	}
	return n.cfg.Snapshots.List(ctx, kinds...)
}

// GetSnapshot returns a snapshot by id or name.
func (n *Node) GetSnapshot(ctx context.Context, idOrName string) (*snapshot.Snapshot, error) {
	if n.cfg.Snapshots == nil {
		return nil, fmt.Errorf("looking up snapshot %q: %w", idOrName, snapshot.ErrNotFound)
	}
	return n.cfg.Snapshots.Get(ctx, idOrName)
}

// DeleteSnapshot removes a snapshot.
func (n *Node) DeleteSnapshot(ctx context.Context, id string) error {
	if n.cfg.Snapshots == nil {
		return fmt.Errorf("deleting snapshot %q: %w", id, snapshot.ErrNotFound)
	}
	if err := n.cfg.Snapshots.Delete(ctx, id); err != nil {
		return err
	}
	// Its prestarted sandboxes are of a snapshot nobody may use now.
	n.pool.forget(PoolKey{SnapshotID: id})
	return nil
}

func (n *Node) unregister(id string) {
	n.mu.Lock()
	delete(n.sandboxes, id)
	n.mu.Unlock()
}

func (n *Node) notifyExit(id, reason string) {
	n.mu.Lock()
	fn := n.onExit
	n.mu.Unlock()
	if fn != nil {
		fn(Exit{ID: id, Reason: reason})
	}
}
