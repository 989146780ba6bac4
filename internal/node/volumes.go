package node

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/egress"
	"github.com/aenvhq/aenv/internal/netns"

	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/volume"
)

// volumeBinds binds the volumes of mounts read-write at their paths.
func (n *Node) volumeBinds(mounts []snapshot.Mount) ([]runtime.Bind, error) {
	var binds []runtime.Bind
	for _, m := range mounts {
		if n.cfg.Volumes == nil || !n.cfg.Volumes.Exists(m.VolumeID) {
			return nil, fmt.Errorf("mounting volume %s: %w: it is not on node %s", m.VolumeID, ErrNotFound, n.cfg.ID)
		}
		if !path.IsAbs(m.Path) || path.Clean(m.Path) == "/" {
			return nil, fmt.Errorf("mounting volume %s at %q: %w: the path must be absolute and not /", m.VolumeID, m.Path, ErrInvalid)
		}
		// Get mounts an image volume whose mount is gone: the sandbox
		// must never see the bare mount point, where no size holds.
		src, err := n.cfg.Volumes.Get(m.VolumeID)
		if err != nil {
			return nil, err
		}
		binds = append(binds, runtime.Bind{Source: src, Destination: path.Clean(m.Path), Writable: true})
	}
	return binds, nil
}

// CreateVolume makes volume id on this node, of size bytes (0: the
// node's VolumeSize), and returns its size (0: a plain directory).
func (n *Node) CreateVolume(id string, size int64) (int64, error) {
	if n.cfg.Volumes == nil {
		return 0, fmt.Errorf("creating volume %s: %w: this node keeps no volumes", id, ErrUnsupported)
	}
	if size == 0 {
		size = n.cfg.VolumeSize
		if size == 0 {
			size = DefaultVolumeSize
		}
		size = max(size, 0)
	}
	if _, err := n.cfg.Volumes.Create(id, size); errors.Is(err, volume.ErrInvalid) {
		return 0, fmt.Errorf("%w: %w", ErrInvalid, err)
	} else if err != nil {
		return 0, err
	}
	return n.cfg.Volumes.Size(id), nil
}

// DeleteVolume removes volume id and its files from this node.
func (n *Node) DeleteVolume(id string) error {
	if n.cfg.Volumes == nil || !n.cfg.Volumes.Exists(id) {
		return fmt.Errorf("deleting volume %s: %w", id, ErrNotFound)
	}
	return n.cfg.Volumes.Delete(id)
}

// UpdateNetwork replaces a running sandbox's egress rules; connections it
// has open stay.
func (n *Node) UpdateNetwork(ctx context.Context, id string, opts netns.SlotOptions) error {
	sb, err := n.Get(id)
	if err != nil {
		return err
	}
	if err := n.cfg.Network.UpdateEgress(ctx, sb.slot, opts); err != nil {
		return fmt.Errorf("updating the network of sandbox %s: %w", id, err)
	}
	n.mu.Lock()
	sb.egress = opts
	n.mu.Unlock()
	n.logEvent(id, "info", "network rules updated", "allow_out", fmt.Sprint(len(opts.AllowOut)+len(opts.AllowDomains)),
		"deny_out", fmt.Sprint(len(opts.DenyOut)))
	return nil
}

// EgressRefused records a connection the sandbox on slot s was refused.
func (n *Node) EgressRefused(s *netns.Slot, r egress.Refusal) {
	n.mu.Lock()
	var id string
	for _, sb := range n.sandboxes {
		if sb.slot == s {
			id = sb.ID
		}
	}
	n.mu.Unlock()
	if id == "" {
		return
	}
	n.logEvent(id, "warn", "egress refused", "dst", r.Dst.String(), "domain", r.Domain, "reason", r.Reason)
}

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
	if err := fx.ExportFiles(ctx, sb.ID, filepath.Join(dir, snapshot.FilesFile)); err != nil {
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
	n.register(ctx, sb)
	n.logEvent(id, "info", "sandbox booted afresh with its saved files", "snapshot_id", snap.ID,
		"took_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
	n.log.Info("sandbox restored from its files", "sandbox_id", id, "snapshot_id", snap.ID, "total_ms", time.Since(start).Milliseconds())
	return sb, nil
}

// Where putFiles stages a files-only snapshot inside the sandbox.
const (
	filesTarPath  = "/tmp/.aenv-files.tar"
	whiteoutsPath = "/tmp/.aenv-whiteouts"
)

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
				if h.Typeflag == tar.TypeChar && h.Devmajor == 0 && h.Devminor == 0 {
					whiteouts.WriteString("/" + strings.TrimPrefix(path.Clean("/"+h.Name), "/") + "\x00")
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
		ImageDir: snap.Dir, DiskMB: snap.WritableMB, Mounts: snap.Mounts})
	if err != nil {
		return nil, fmt.Errorf("rebooting from snapshot %s: restoring it to read its files: %w", snap.ID, err)
	}
	err = fx.ExportFiles(ctx, scratch.ID, filepath.Join(dir, snapshot.FilesFile))
	n.destroy(context.WithoutCancel(ctx), scratch)
	if err != nil {
		return nil, fmt.Errorf("rebooting from snapshot %s: %w", snap.ID, err)
	}
	files := *snap
	files.FilesOnly, files.Dir = true, dir
	return n.restoreFiles(ctx, &files, req)
}

// volumeMeta describes a moving volume in the store: its size goes with
// it (0, or none from an older node: a plain directory).
type volumeMeta struct {
	Volume    string `json:"volume"`
	SizeBytes int64  `json:"sizeBytes,omitempty"`
}

// volumeKey is where a moving volume's files wait in the store.
func volumeKey(id string) string { return "volume-" + id }

// ExportVolume saves volume id's files to the store, for another node's
// ImportVolume.
func (n *Node) ExportVolume(ctx context.Context, id string) (int64, error) {
	if n.cfg.Store == nil {
		return 0, fmt.Errorf("moving volume %s: %w: the cluster has no store (--store) to move it through", id, ErrUnsupported)
	}
	if n.cfg.Volumes == nil || !n.cfg.Volumes.Exists(id) {
		return 0, fmt.Errorf("moving volume %s: %w", id, ErrNotFound)
	}
	f, err := os.CreateTemp("", "aenv-volume-*.tar")
	if err != nil {
		return 0, fmt.Errorf("moving volume %s: %w", id, err)
	}
	defer os.Remove(f.Name())
	size, err := n.cfg.Volumes.Archive(id, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("moving volume %s: %w", id, err)
	}
	meta, _ := json.Marshal(volumeMeta{Volume: id, SizeBytes: n.cfg.Volumes.Size(id)})
	if _, _, err := n.cfg.Store.Save(ctx, volumeKey(id), "", map[string]string{"volume.tar": f.Name()}, meta); err != nil {
		return 0, fmt.Errorf("moving volume %s: saving it: %w", id, err)
	}
	n.log.Info("volume saved to the store to move", "volume_id", id, "bytes", size)
	return size, nil
}

// ImportVolume makes volume id on this node from what ExportVolume saved,
// then drops that from the store.
func (n *Node) ImportVolume(ctx context.Context, id string) error {
	if n.cfg.Store == nil || n.cfg.Volumes == nil {
		return fmt.Errorf("moving volume %s here: %w: no store or no volume directory", id, ErrUnsupported)
	}
	dir, err := os.MkdirTemp("", "aenv-volume-")
	if err != nil {
		return fmt.Errorf("moving volume %s here: %w", id, err)
	}
	defer os.RemoveAll(dir)
	m, err := n.cfg.Store.Get(ctx, volumeKey(id))
	if err != nil {
		return fmt.Errorf("moving volume %s here: fetching it: %w", id, err)
	}
	var meta volumeMeta
	if len(m.Meta) > 0 {
		if err := json.Unmarshal(m.Meta, &meta); err != nil {
			return fmt.Errorf("moving volume %s here: reading its description: %w", id, err)
		}
	}
	if err := n.cfg.Store.Restore(ctx, volumeKey(id), dir); err != nil {
		return fmt.Errorf("moving volume %s here: fetching it: %w", id, err)
	}
	f, err := os.Open(filepath.Join(dir, "volume.tar"))
	if err != nil {
		return fmt.Errorf("moving volume %s here: %w", id, err)
	}
	defer f.Close()
	if err := n.cfg.Volumes.Extract(id, f, meta.SizeBytes); err != nil {
		return fmt.Errorf("moving volume %s here: %w", id, err)
	}
	if err := n.cfg.Store.Delete(ctx, volumeKey(id)); err != nil {
		n.log.Warn("dropping a moved volume's copy from the store", "volume_id", id, "err", err)
	}
	n.log.Info("volume moved here", "volume_id", id)
	return nil
}
