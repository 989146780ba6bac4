package template

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// lockDir opens dir and takes an exclusive flock on it without waiting;
// the lock lives as long as the returned file. It returns errLocked when
// someone else holds it.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, errLocked
		}
		return nil, fmt.Errorf("locking %s: %w", dir, err)
	}
	return f, nil
}

// syncFS flushes the filesystem that holds f to disk.
func syncFS(f *os.File) error { return unix.Syncfs(int(f.Fd())) }

// swapDir moves src to dst in one step. When dst exists the two are
// exchanged atomically (src then holds the old dst) and replaced is true.
func swapDir(src, dst string) (replaced bool, err error) {
	err = unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if err == nil {
		return false, nil
	}
	if !errors.Is(err, unix.EEXIST) {
		return false, fmt.Errorf("renaming %s to %s: %w", src, dst, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
		return false, fmt.Errorf("exchanging %s and %s: %w", src, dst, err)
	}
	return true, nil
}
