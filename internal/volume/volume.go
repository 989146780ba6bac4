// Package volume holds sandbox volumes on a node: one directory per
// volume under the node's volume directory, mounted read-write into the
// sandboxes that ask for it, and the data plane E2B's Volume class speaks
// (/volumecontent/{volumeID}/dir|path|file). Every path is resolved
// through os.Root, so no request (a "..", an absolute path, a symlink a
// sandbox planted) reaches outside its volume.
//
// A volume with a size is a sparse ext4 image beside its directory
// (<id>.ext4), loop-mounted on it: past the size, writes inside fail with
// ENOSPC, and the host's disk holds only what was written. Volumes made
// before sizes existed are plain directories, unbounded, and stay so.
// Only package node and the node's wiring (node/nodeserver, agent,
// server) import it; the API checks ids and sizes with ids.Valid and the
// node API's bounds instead.
package volume

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// validID is what a volume id looks like (the cluster makes them).
var validID = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// ValidID reports whether id can name a volume.
func ValidID(id string) bool { return validID.MatchString(id) }

// ErrNotFound is returned for a volume this node does not hold.
var ErrNotFound = errors.New("volume not found")

// ErrInvalid is returned for a size out of bounds.
var ErrInvalid = errors.New("invalid volume")

// The bounds of a volume's size: ext4 wants a few MiB for its journal
// and tables, and 16 TiB is what it addresses with 4 KiB blocks.
const (
	MinSize = 8 << 20
	MaxSize = 16 << 40
)

// imageSuffix names a volume's image beside its directory; ids have no
// dots, so no volume is named like an image.
const imageSuffix = ".ext4"

// Dir is a node's volume directory. It is safe for concurrent use.
type Dir struct {
	root string
	// mu serialises mounting and unmounting, so that two requests for an
	// unmounted volume do not stack two mounts on it.
	mu sync.Mutex
}

// Open opens (creating) the volume directory root. It does not mount
// anything: MountAll does, at the node's start.
func Open(root string) (*Dir, error) {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("opening volume directory: %w", err)
	}
	return &Dir{root: root}, nil
}

// Path is where volume id's files are on the host (for an image volume,
// its mount point: Get makes sure it is mounted).
func (d *Dir) Path(id string) (string, error) {
	if !ValidID(id) {
		return "", fmt.Errorf("volume %q: %w", id, ErrNotFound)
	}
	return filepath.Join(d.root, id), nil
}

func (d *Dir) image(id string) string { return filepath.Join(d.root, id+imageSuffix) }

// Create makes volume id (owned by the sandboxes' default user, uid
// 1000, as E2B's volumes are) and returns its path: with size > 0 an ext4
// image of size bytes, mounted; with size 0 a plain directory without a
// bound. An existing volume is kept (and mounted).
func (d *Dir) Create(id string, size int64) (string, error) {
	p, err := d.Path(id)
	if err != nil {
		return "", err
	}
	if size != 0 && (size < MinSize || size > MaxSize) {
		return "", fmt.Errorf("creating volume %s: %w: size %d bytes is not within %d MiB and %d TiB", id, ErrInvalid, size, MinSize>>20, MaxSize>>40)
	}
	if size == 0 || d.hasImage(id) {
		return d.createDir(id, p)
	}
	// The image is made aside and renamed into place: an image there is
	// always a whole file system.
	tmp := d.image(id) + ".tmp"
	if err := makeImage(tmp, size); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	if err := os.Rename(tmp, d.image(id)); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		os.Remove(d.image(id))
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	if _, err := d.Get(id); err != nil {
		// Nothing is in it yet: a volume that cannot mount is not made.
		os.Remove(d.image(id))
		os.Remove(p)
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	// mkfs leaves lost+found, which E2B's volumes lack (a listing of a new
	// volume is empty); it is made again only by an fsck.
	if err := os.Remove(filepath.Join(p, "lost+found")); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	return p, nil
}

func (d *Dir) createDir(id, p string) (string, error) {
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	if d.hasImage(id) {
		if _, err := d.Get(id); err != nil {
			return "", err
		}
	}
	if err := os.Chown(p, DefaultUID, DefaultGID); err != nil {
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	return p, nil
}

func (d *Dir) hasImage(id string) bool {
	fi, err := os.Stat(d.image(id))
	return err == nil && fi.Mode().IsRegular()
}

// Get returns the host path of volume id ready for use: an image volume
// whose image is not mounted (after a reboot) is mounted first, so that
// nothing writes into the bare mount point, where no size holds.
func (d *Dir) Get(id string) (string, error) {
	p, err := d.Path(id)
	if err != nil || !d.Exists(id) {
		return "", fmt.Errorf("volume %s: %w", id, ErrNotFound)
	}
	if !d.hasImage(id) {
		return p, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if mounted(p) {
		return p, nil
	}
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("mounting volume %s: %w", id, err)
	}
	if err := mountImage(d.image(id), p); err != nil {
		return "", fmt.Errorf("mounting volume %s: %w", id, err)
	}
	return p, nil
}

// Size is volume id's size in bytes; 0 for a plain directory.
func (d *Dir) Size(id string) int64 {
	if !ValidID(id) {
		return 0
	}
	fi, err := os.Stat(d.image(id))
	if err != nil {
		return 0
	}
	return fi.Size()
}

// MountAll mounts the image of every volume that is not mounted: what a
// node does at start, after a reboot unmounted them (a restart without a
// reboot finds them mounted still, in use by the sandboxes that outlived
// it). It tries them all and returns what failed.
func (d *Dir) MountAll() error {
	entries, err := os.ReadDir(d.root)
	if err != nil {
		return fmt.Errorf("listing volumes: %w", err)
	}
	var errs []error
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), imageSuffix)
		if !ok || !ValidID(id) {
			continue
		}
		if _, err := d.Get(id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// UnmountAll unmounts every volume's image, for a node that stops with no
// sandbox left to use them; the next start mounts them again.
func (d *Dir) UnmountAll() error {
	entries, err := os.ReadDir(d.root)
	if err != nil {
		return fmt.Errorf("listing volumes: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if id, ok := strings.CutSuffix(e.Name(), imageSuffix); ok && ValidID(id) {
			errs = append(errs, d.unmount(id))
		}
	}
	return errors.Join(errs...)
}

func (d *Dir) unmount(id string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	p := filepath.Join(d.root, id)
	if !mounted(p) {
		return nil
	}
	if err := unmountImage(p); err != nil {
		return fmt.Errorf("unmounting volume %s: %w", id, err)
	}
	return nil
}

// Delete removes volume id and its files.
func (d *Dir) Delete(id string) error {
	p, err := d.Path(id)
	if err != nil {
		return err
	}
	if d.hasImage(id) {
		if err := d.unmount(id); err != nil {
			return fmt.Errorf("deleting volume %s: %w", id, err)
		}
		if err := os.Remove(d.image(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("deleting volume %s: %w", id, err)
		}
	}
	// Never remove a mounted tree file by file: that is some other
	// volume's, or a mount this package did not make.
	if mounted(p) {
		return fmt.Errorf("deleting volume %s: %s is still a mount point", id, p)
	}
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("deleting volume %s: %w", id, err)
	}
	return nil
}

// Exists reports whether this node holds volume id.
func (d *Dir) Exists(id string) bool {
	p, err := d.Path(id)
	if err != nil {
		return false
	}
	if d.hasImage(id) {
		return true
	}
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
