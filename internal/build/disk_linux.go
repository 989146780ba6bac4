package build

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// diskPrefix starts the directories of build disks in Limits.DiskDir.
const diskPrefix = "build-"

// disk is one build's own file system: a sparse ext4 image of a fixed
// size, loop-mounted, that the build's tree is written to. A build that
// writes without end fills it, not the host's disk.
type disk struct {
	dir  string // the image and the mount point
	mnt  string
	size int64
}

// newDisk makes and mounts a disk of size bytes under parent.
func newDisk(ctx context.Context, parent string, size int64) (_ *disk, err error) {
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, fmt.Errorf("making a build disk: %w", err)
	}
	dir, err := os.MkdirTemp(parent, diskPrefix)
	if err != nil {
		return nil, fmt.Errorf("making a build disk: %w", err)
	}
	d := &disk{dir: dir, mnt: filepath.Join(dir, "mnt"), size: size}
	defer func() {
		if err != nil {
			d.remove()
		}
	}()
	img := filepath.Join(dir, "disk.ext4")
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("making a build disk: %w", err)
	}
	err = f.Truncate(size) // sparse: blocks are taken as they are written
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("making a build disk of %d bytes: %w", size, err)
	}
	// No blocks reserved for root (every writer is root here) and no
	// journal: the disk lives only as long as its build.
	mkfs := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
		"-E", "lazy_itable_init=1,nodiscard", img)
	if out, err := mkfs.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("making a build disk: mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	if err := os.Mkdir(d.mnt, 0o700); err != nil {
		return nil, fmt.Errorf("making a build disk: %w", err)
	}
	// mount(8) sets up the loop device to detach itself at unmount. The
	// host never runs what a build writes: no devices, no setuid.
	mount := exec.CommandContext(ctx, "mount", "-t", "ext4", "-o", "loop,nodev,nosuid", img, d.mnt)
	if out, err := mount.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mounting a build disk: %w: %s", err, strings.TrimSpace(string(out)))
	}
	for _, sub := range []string{d.root(), d.scratch()} {
		if err := os.Mkdir(sub, 0o755); err != nil {
			return nil, fmt.Errorf("making a build disk: %w", err)
		}
	}
	return d, nil
}

// root is where the build's tree is written.
func (d *disk) root() string { return filepath.Join(d.mnt, "rootfs") }

// scratch holds the FROM image's downloads.
func (d *disk) scratch() string { return filepath.Join(d.mnt, "scratch") }

// full reports whether the disk has (next to) no room left, in blocks or
// inodes: a failure then is the disk's, whatever the command said.
func (d *disk) full() bool {
	var st unix.Statfs_t
	if err := unix.Statfs(d.mnt, &st); err != nil {
		return false
	}
	return int64(st.Bavail)*st.Bsize < 1<<20 || st.Ffree == 0
}

// remove unmounts the disk and deletes it.
func (d *disk) remove() error {
	if err := unmount(d.mnt); err != nil {
		return fmt.Errorf("removing build disk %s: %w", d.dir, err)
	}
	if err := os.RemoveAll(d.dir); err != nil {
		return fmt.Errorf("removing build disk %s: %w", d.dir, err)
	}
	return nil
}

// unmount unmounts dir if something is mounted there. Files a step's
// sandbox still holds for a moment make it busy; past a few seconds it is
// detached lazily, and the loop device goes once the last user lets go.
func unmount(dir string) error {
	for i := 0; ; i++ {
		err := unix.Unmount(dir, 0)
		switch {
		case err == nil:
			continue // mounted twice? peel the next
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not (or no longer) a mount point
		case errors.Is(err, unix.EBUSY) && i < 50:
			time.Sleep(100 * time.Millisecond)
		case errors.Is(err, unix.EBUSY):
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("unmounting %s: %w", dir, err)
			}
			return nil
		default:
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
	}
}

// RemoveDisks removes the build disks a process that died mid-build left
// in dir (Limits.DiskDir). Call it before any build runs.
func RemoveDisks(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing leftover build disks: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), diskPrefix) {
			continue
		}
		d := &disk{dir: filepath.Join(dir, e.Name()), mnt: filepath.Join(dir, e.Name(), "mnt")}
		errs = append(errs, d.remove())
	}
	return errors.Join(errs...)
}
