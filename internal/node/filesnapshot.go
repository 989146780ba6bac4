package node

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// snapshotFiles saves sb's files (not its memory) into the staged
// snapshot at dir and ends sb; a failed save leaves it running.
func (n *Node) snapshotFiles(ctx context.Context, sb *Sandbox, snap *snapshot.Snapshot, dir string, start time.Time) (*snapshot.Snapshot, error) {
	fx, ok := n.cfg.Runtime.(runtime.FilesExporter)
	if !ok {
		n.cfg.Snapshots.Abort(snap.ID)
		return nil, fmt.Errorf("pausing sandbox %s without its memory: runtime %s: %w", sb.ID, n.cfg.Runtime.Name(), ErrUnsupported)
	}
	snap.FilesOnly = true
	n.mu.Lock()
	snap.EnvVars = maps.Clone(sb.envVars)
	n.mu.Unlock()
	if err := fx.ExportFiles(ctx, sb.rt(), filepath.Join(dir, snapshot.FilesFile)); err != nil {
		n.cfg.Snapshots.Abort(snap.ID)
		return nil, fmt.Errorf("pausing sandbox %s without its memory: %w", sb.ID, err)
	}
	if err := n.cfg.Snapshots.Commit(ctx, snap); err != nil {
		n.cfg.Snapshots.Abort(snap.ID)
		return nil, fmt.Errorf("pausing sandbox %s without its memory: %w", sb.ID, err)
	}
	n.unregister(sb.ID)
	if err := n.destroy(context.WithoutCancel(ctx), sb); err != nil {
		n.log.Warn("releasing paused sandbox", "sandbox_id", sb.ID, "err", err)
	}
	n.logEvent(sb.ID, "info", "sandbox stopped: its files are saved, not its memory", "snapshot_id", snap.ID,
		"size_bytes", strconv.FormatInt(snap.SizeBytes, 10))
	n.historyEnded(sb.ID)
	n.log.Info("sandbox paused without its memory", "sandbox_id", sb.ID, "snapshot_id", snap.ID,
		"size_bytes", snap.SizeBytes, "total_ms", time.Since(start).Milliseconds())
	return snap, nil
}

// restoreFiles starts a sandbox afresh from the template of a files-only
// snapshot, with the snapshot's files put back (deletions too) and its
// environment and token, as after a reboot.
func (n *Node) restoreFiles(ctx context.Context, snap *snapshot.Snapshot, req CreateRequest) (_ *Sandbox, err error) {
	tpl, id, err := n.restoreTarget(ctx, snap, req)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	sb, err := n.boot(ctx, id, tpl, bootOptions{CPUCount: snap.CPUCount, MemoryMB: snap.MemoryMB, Network: req.Network, Mounts: snap.Mounts})
	if err != nil {
		return nil, fmt.Errorf("restoring snapshot %s: %w", snap.ID, err)
	}
	defer func() {
		if err != nil {
			n.destroy(context.WithoutCancel(ctx), sb)
		}
	}()
	sb.EnvdAccessToken = snap.EnvdAccessToken
	sb.envVars = snap.EnvVars
	envd := newEnvdClient(sb.Addr, "")
	if err := envd.init(ctx, initFor(tpl, snap.EnvVars, sb.EnvdAccessToken)); err != nil {
		return nil, fmt.Errorf("restoring snapshot %s: initialising envd: %w", snap.ID, err)
	}
	if err := n.putFiles(ctx, sb, filepath.Join(snap.Dir, snapshot.FilesFile)); err != nil {
		return nil, fmt.Errorf("restoring snapshot %s: %w", snap.ID, err)
	}
	n.register(ctx, sb, req.TeamID)
	n.logEvent(id, "info", "sandbox booted afresh with its saved files", "snapshot_id", snap.ID,
		"took_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
	n.log.Info("sandbox restored from its files", "sandbox_id", id, "snapshot_id", snap.ID, "total_ms", time.Since(start).Milliseconds())
	return sb, nil
}

// putFiles puts a files-only snapshot's tar (from runtime.FilesExporter)
// back into a fresh sandbox: the files it deleted go first (its overlay
// whiteouts), then the rest is extracted as root, owners and modes kept.
func (n *Node) putFiles(ctx context.Context, sb *Sandbox, tarPath string) error {
	f, err := os.Open(tarPath)
	if err != nil {
		return fmt.Errorf("putting its files back: %w", err)
	}
	defer f.Close()
	// The files stream into the sandbox as they are read; the deletions
	// are known once they all are.
	var whiteouts bytes.Buffer
	pr, pw := io.Pipe()
	split := make(chan error, 1)
	go func() {
		split <- func() error {
			tr := tar.NewReader(f)
			tw := tar.NewWriter(pw)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					return tw.Close()
				}
				if err != nil {
					return fmt.Errorf("reading the tar: %w", err)
				}
				name := path.Clean("/" + h.Name)
				if name == runtime.ToolsDir || strings.HasPrefix(name, runtime.ToolsDir+"/") {
					// Its mount point, which a sandbox without a gofer
					// makes in its root's upper layer: extracted onto
					// the read-only mount, it failed the whole restore.
					continue
				}
				if h.Typeflag == tar.TypeChar && h.Devmajor == 0 && h.Devminor == 0 {
					whiteouts.WriteString(name + "\x00")
					continue
				}
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
				if _, err := io.Copy(tw, tr); err != nil {
					return err
				}
			}
		}()
		pw.Close()
	}()
	envd := newEnvdClient(sb.Addr, sb.EnvdAccessToken)
	uerr := envd.upload(ctx, "root", filesTarPath, pr)
	// envd may answer before reading everything: the splitter must be
	// done (and whiteouts complete) before anything else reads them.
	pr.Close()
	serr := <-split
	if uerr != nil {
		return fmt.Errorf("putting its files back: %w", uerr)
	}
	if serr != nil {
		return fmt.Errorf("putting its files back: %w", serr)
	}
	if err := envd.upload(ctx, "root", whiteoutsPath, &whiteouts); err != nil {
		return fmt.Errorf("putting its files back: %w", err)
	}
	script := fmt.Sprintf("xargs -0 -r rm -rf -- < %s && tar -xpf %s -C / --numeric-owner && rm -f %s %s",
		whiteoutsPath, filesTarPath, filesTarPath, whiteoutsPath)
	code, out, err := newProcessClient(sb).withToken(sb.EnvdAccessToken).runAs(ctx, "root", script, false)
	if err != nil || code != 0 {
		return fmt.Errorf("putting its files back: extracting them: exit %d %v: %s", code, err, out)
	}
	return nil
}

// reboot resumes a sandbox paused with its memory by booting afresh with
// its files: the saved state is restored under a scratch id just long
// enough to export what it wrote, then the sandbox boots as from a
// files-only snapshot.
func (n *Node) reboot(ctx context.Context, snap *snapshot.Snapshot, req CreateRequest) (*Sandbox, error) {
	if err := n.CanRestore(snap); err != nil {
		return nil, err
	}
	fx, ok := n.cfg.Runtime.(runtime.FilesExporter)
	if !ok {
		return nil, fmt.Errorf("rebooting from snapshot %s: runtime %s: %w", snap.ID, n.cfg.Runtime.Name(), ErrUnsupported)
	}
	tpl, _, err := n.restoreTarget(ctx, snap, req)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "aenv-reboot-")
	if err != nil {
		return nil, fmt.Errorf("rebooting from snapshot %s: %w", snap.ID, err)
	}
	defer os.RemoveAll(dir)
	scratch, err := n.boot(ctx, NewID(), tpl, bootOptions{CPUCount: snap.CPUCount, MemoryMB: snap.MemoryMB,
		ImageDir: snap.Dir, DiskMB: snap.WritableMB, RootImage: snap.RootImage, Mounts: snap.Mounts})
	if err != nil {
		return nil, fmt.Errorf("rebooting from snapshot %s: restoring it to read its files: %w", snap.ID, err)
	}
	err = fx.ExportFiles(ctx, scratch.rt(), filepath.Join(dir, snapshot.FilesFile))
	n.destroy(context.WithoutCancel(ctx), scratch)
	if err != nil {
		return nil, fmt.Errorf("rebooting from snapshot %s: %w", snap.ID, err)
	}
	files := *snap
	files.FilesOnly, files.Dir = true, dir
	return n.restoreFiles(ctx, &files, req)
}
