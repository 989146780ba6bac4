package envd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// resolvePath makes p absolute: "~" and relative paths are taken from u's
// home directory, as E2B clients expect.
func resolvePath(u *sysUser, p string) string {
	switch {
	case p == "~":
		p = u.Home
	case strings.HasPrefix(p, "~/"):
		p = filepath.Join(u.Home, p[2:])
	case !filepath.IsAbs(p):
		p = filepath.Join(u.Home, p)
	}
	return filepath.Clean(p)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// canSwitchUser reports whether envd may act as u: as root it can be
// anyone; otherwise (tests on a laptop) only itself.
func canSwitchUser(u *sysUser) (bool, error) {
	if os.Geteuid() == 0 {
		// Staying root needs no setuid/setgroups, and so works even when
		// the sandbox withheld CAP_SETUID and CAP_SETGID from envd.
		sameIDs := u.UID == 0 && u.GID == uint32(os.Getegid())
		return !sameIDs, nil
	}
	if u.UID == uint32(os.Geteuid()) {
		return false, nil
	}
	return false, fmt.Errorf("acting as user %s: %w: envd is not root", u.Name, fs.ErrPermission)
}

// chownNew gives a file envd just created to u (when envd is root).
func chownNew(u *sysUser, p string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	if err := os.Lchown(p, int(u.UID), int(u.GID)); err != nil {
		return fmt.Errorf("giving %s to %s: %w", p, u.Name, err)
	}
	return nil
}

// mkdirAll creates dir and any missing parents, each owned by u. It
// reports whether dir itself was created.
func mkdirAll(u *sysUser, dir string) (bool, error) {
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return false, fmt.Errorf("creating directory %s: %w: a file is in the way", dir, errInvalid)
		}
		return false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("creating directory %s: %w", dir, err)
	}
	if parent := filepath.Dir(dir); parent != dir {
		if _, err := mkdirAll(u, parent); err != nil {
			return false, err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) && isDir(dir) {
			return false, nil // created concurrently
		}
		return false, fmt.Errorf("creating directory %s: %w", dir, err)
	}
	return true, chownNew(u, dir)
}
