package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"

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

// Where putFiles stages a files-only snapshot inside the sandbox.
const (
	filesTarPath  = "/tmp/.aenv-files.tar"
	whiteoutsPath = "/tmp/.aenv-whiteouts"
)

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
