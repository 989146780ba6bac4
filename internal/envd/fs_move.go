package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// Move renames a file or directory, creating the destination's parents.
// Across filesystems (e.g. /tmp to the home directory) it copies and
// deletes instead.
func (fsvc *filesystemService) Move(_ context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	// A login shell's start-up may read what this changes.
	defer fsvc.s.shells.changed(readyShellQuiet)
	u, db, err := fsvc.requestContext(req.Header())
	if err != nil {
		return nil, connectError(err)
	}
	src := resolvePath(u, req.Msg.GetSource())
	dst := resolvePath(u, req.Msg.GetDestination())
	if _, err := os.Lstat(src); err != nil {
		return nil, connectError(fmt.Errorf("moving %s: %w", src, err))
	}
	if _, err := mkdirAll(u, filepath.Dir(dst)); err != nil {
		return nil, connectError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		if !errors.Is(err, syscall.EXDEV) {
			return nil, connectError(fmt.Errorf("moving %s to %s: %w", src, dst, err))
		}
		if err := copyTree(src, dst); err != nil {
			return nil, connectError(fmt.Errorf("moving %s to %s: %w", src, dst, err))
		}
		if err := os.RemoveAll(src); err != nil {
			return nil, connectError(fmt.Errorf("moving %s to %s: removing source: %w", src, dst, err))
		}
	}
	e, err := statEntry(db, dst)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// copyTree copies src to dst keeping modes, owners and symlinks.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case fi.IsDir():
			if err := os.Mkdir(target, fi.Mode().Perm()); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
		default:
			if err := copyFile(p, target, fi.Mode().Perm()); err != nil {
				return err
			}
		}
		if uid, gid, _, ok := fileOwner(fi); ok {
			_ = os.Lchown(target, int(uid), int(gid))
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
