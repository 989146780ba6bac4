package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/template"
)

// ServiceTimeout bounds how long a template's start command may take to
// pass its ready check.
const ServiceTimeout = 3 * time.Minute

// toolBinds binds the node binaries a template asks for at /.aenv/<name>.
func (n *Node) toolBinds(tpl *template.Template) ([]runtime.Bind, error) {
	var binds []runtime.Bind
	for _, name := range tpl.Tools {
		src := filepath.Join(filepath.Dir(n.cfg.EnvdPath), name)
		if _, err := os.Stat(src); err != nil {
			return nil, fmt.Errorf("template %s needs the node's %s binary next to envd: %w", tpl.ID, name, err)
		}
		binds = append(binds, runtime.Bind{Source: src, Destination: runtime.ToolsDir + "/" + name})
	}
	return binds, nil
}

// readyName names the snapshot of tpl's started service. Whatever the
// running service depends on is in it, so that a changed template, start
// command, resources, runtime or node binary gets a snapshot of its own
// (and nodes that differ never claim one name twice).
func (n *Node) readyName(tpl *template.Template) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%d\x00%s\x00%s\x00%d\x00%d\x00%d\x00%s\x00%s\x00", tpl.ID, tpl.CreatedAt.UnixNano(), tpl.StartCmd, tpl.ReadyCmd,
		tpl.CPUCount, tpl.MemoryMB, pick(tpl.DiskMB, n.cfg.DiskMB), n.cfg.Runtime.Name(), n.cfg.RuntimeVersion)
	for _, name := range tpl.Tools {
		if fi, err := os.Stat(filepath.Join(filepath.Dir(n.cfg.EnvdPath), name)); err == nil {
			fmt.Fprintf(h, "%s\x00%d\x00%d\x00", name, fi.Size(), fi.ModTime().UnixNano())
		}
	}
	return "ready-" + tpl.ID + "-" + hex.EncodeToString(h.Sum(nil))[:16]
}

// hasService says whether tpl's sandboxes start from a snapshot of its
// started service.
func (n *Node) hasService(tpl *template.Template) bool {
	return tpl.StartCmd != "" && n.cfg.Snapshots != nil
}

// readySnapshot returns the snapshot of tpl's service up and ready,
// making it first if no node has (once per node at a time).
func (n *Node) readySnapshot(ctx context.Context, tpl *template.Template) (*snapshot.Snapshot, error) {
	name := n.readyName(tpl)
	// Known here: a lookup by name would list the catalog (and the
	// store's) on every create.
	n.mu.Lock()
	snap := n.ready[name]
	n.mu.Unlock()
	if snap != nil {
		if _, err := os.Stat(snap.Dir); err == nil {
			return snap, nil
		}
	}
	if snap, err := n.cfg.Snapshots.Fetch(ctx, name); err == nil && n.CanRestore(snap) == nil {
		n.rememberReady(name, snap)
		return snap, nil
	} else if err != nil && !errors.Is(err, snapshot.ErrNotFound) {
		return nil, fmt.Errorf("starting template %s's service: %w", tpl.ID, err)
	}
	ch := n.readying.DoChan(name, func() (any, error) {
		// Whoever asked first may give up; the others still need it. A
		// closing node stops it.
		n.mu.Lock()
		if n.bg.Err() != nil {
			n.mu.Unlock()
			return nil, fmt.Errorf("starting template %s's service: the node is closing", tpl.ID)
		}
		n.bgWork.Add(1)
		n.mu.Unlock()
		defer n.bgWork.Done()
		return n.startService(n.bg, tpl, name)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		n.rememberReady(name, r.Val.(*snapshot.Snapshot))
		return r.Val.(*snapshot.Snapshot), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("starting template %s's service: %w", tpl.ID, ctx.Err())
	}
}

func (n *Node) rememberReady(name string, snap *snapshot.Snapshot) {
	n.mu.Lock()
	n.ready[name] = snap
	n.mu.Unlock()
}

// startService boots a sandbox of tpl, runs its start command, waits for
// its ready check and saves the sandbox as the template's ready snapshot.
// The sandbox is never registered: nobody can reach it, and the cluster
// never sees it.
func (n *Node) startService(ctx context.Context, tpl *template.Template, name string) (*snapshot.Snapshot, error) {
	start := time.Now()
	log := n.log.With("template_id", tpl.ID)
	log.Info("starting the template's service to snapshot it", "start_cmd", tpl.StartCmd, "ready_cmd", tpl.ReadyCmd)
	sb, err := n.boot(ctx, NewID(), tpl, bootOptions{Network: netns.SlotOptions{AllowInternet: true}})
	if err != nil {
		return nil, fmt.Errorf("starting template %s's service: %w", tpl.ID, err)
	}
	sb.TemplateID = tpl.ID
	// Never registered nor pooled: its boot counts as pending until it is
	// gone, snapshotted and stopped or destroyed. Left pending, it held
	// every warm pool's refill back for good (the pool refills only while
	// nothing boots) after a node's first start built the snapshot.
	defer n.unpend(sb.ID)
	fail := func(err error) (*snapshot.Snapshot, error) {
		n.destroy(context.WithoutCancel(ctx), sb)
		return nil, fmt.Errorf("starting template %s's service: %w", tpl.ID, err)
	}
	// The service starts where the template's commands run: the image's
	// environment and working directory.
	if err := newEnvdClient(sb.Addr, "").init(ctx, initFor(tpl, nil, "")); err != nil {
		return fail(fmt.Errorf("initialising envd: %w", err))
	}
	envd := newProcessClient(sb)
	code, out, err := envd.run(ctx, tpl.StartCmd, true)
	if err != nil {
		return fail(fmt.Errorf("start command: %w", err))
	}
	if code >= 0 {
		return fail(fmt.Errorf("start command %q exited with %d before its service was ready: %s", tpl.StartCmd, code, out))
	}
	deadline := time.Now().Add(ServiceTimeout)
	for {
		checkCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		code, out, err = envd.run(checkCtx, tpl.ReadyCmd, false)
		cancel()
		if err == nil && code == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("ready check %q did not pass within %v (last: exit %d, %v, %s)", tpl.ReadyCmd, ServiceTimeout, code, err, out))
		}
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	ready := time.Now()
	snap, err := n.snapshotSandbox(ctx, sb, SnapshotOptions{Kind: snapshot.KindTemplate, Names: []string{name}, Stop: true})
	if err != nil {
		return fail(err)
	}
	log.Info("template's service ready and snapshotted", "snapshot_id", snap.ID,
		"ready_ms", ready.Sub(start).Milliseconds(), "total_ms", time.Since(start).Milliseconds())
	return snap, nil
}

// StartService makes the ready snapshot of a template with a start
// command now, ahead of its first sandbox (a build's last step), telling
// out how it went. Templates without one need nothing.
func (n *Node) StartService(ctx context.Context, idOrAlias string, out io.Writer) error {
	tpl, err := n.cfg.Templates.GetLocal(idOrAlias)
	if err != nil {
		return err
	}
	if !n.hasService(tpl) {
		return nil
	}
	start := time.Now()
	fmt.Fprintf(out, "Starting the service: %s (ready when %q succeeds)\n", tpl.StartCmd, tpl.ReadyCmd)
	if _, err := n.readySnapshot(ctx, tpl); err != nil {
		return err
	}
	fmt.Fprintf(out, "Service ready and snapshotted in %s: sandboxes start with it running\n", time.Since(start).Round(100*time.Millisecond))
	return nil
}

// bootService boots a sandbox of tpl from its ready snapshot, with the
// network and for whom opts say (its size and state are the snapshot's);
// like boot, it is not yet initialised nor registered.
func (n *Node) bootService(ctx context.Context, id string, tpl *template.Template, opts bootOptions) (*Sandbox, error) {
	snap, err := n.readySnapshot(ctx, tpl)
	if err != nil {
		return nil, err
	}
	sb, err := n.boot(ctx, id, tpl, bootOptions{
		CPUCount: snap.CPUCount, MemoryMB: snap.MemoryMB, Network: opts.Network, ImageDir: snap.Dir, DiskMB: snap.WritableMB, RootImage: snap.RootImage,
		ForPool: opts.ForPool,
	})
	if err != nil {
		return nil, err
	}
	return sb, nil
}
