package volume

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// makeImage makes a sparse ext4 file system of size bytes in file p.
// No blocks are reserved for root (the sandbox's user gets the whole
// size), and the journal is not zeroed: a new sparse file reads as zeros
// already, and writing them would take its 64 MiB of the host's disk.
func makeImage(p string, size int64) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	owner := strconv.Itoa(DefaultUID) + ":" + strconv.Itoa(DefaultGID)
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0",
		"-E", "root_owner="+owner+",lazy_itable_init=1,lazy_journal_init=1", p).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mkfs.ext4: %w: %s (install e2fsprogs)", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// mountImage loop-mounts image on dir. mount(8) finds a free loop device
// and sets it to go when the file system is unmounted.
func mountImage(image, dir string) error {
	out, err := exec.Command("mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", image, dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("mount: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// unmountImage unmounts dir; one still in use here (a data-plane request
// under way) is detached, and goes when the last user does.
func unmountImage(dir string) error {
	err := unix.Unmount(dir, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(dir, unix.MNT_DETACH)
	}
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}

// mounted reports whether p is a mount point: it is on another device
// than its parent.
func mounted(p string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(p, &st) != nil || unix.Stat(filepath.Dir(p), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}
