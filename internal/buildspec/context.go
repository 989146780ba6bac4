package buildspec

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// UnpackContext unpacks a build context sent as a tar archive (gzipped
// or not, as the E2B SDK uploads the files of a COPY) into dest, which
// must not exist yet. Only directories, regular files and symlinks are
// kept; entries that would land outside dest, directly or through a
// symlink unpacked before them, and sparse files are refused. Owners are not kept (COPY
// sets them).
func UnpackContext(r io.Reader, dest string) (err error) {
	if err := os.Mkdir(dest, 0o755); err != nil {
		return fmt.Errorf("unpacking build context: %w", err)
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dest)
			err = fmt.Errorf("unpacking build context: %w", err)
		}
	}()
	br := bufio.NewReader(r)
	var in io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer zr.Close()
		in = zr
	}
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := path.Clean("/" + h.Name)[1:]
		if name == "" {
			continue
		}
		if strings.Contains(h.Name, "..") && !filepath.IsLocal(filepath.FromSlash(strings.TrimPrefix(h.Name, "/"))) {
			return fmt.Errorf("%w: entry %q leads outside the context", ErrInvalid, h.Name)
		}
		target := filepath.Join(dest, filepath.FromSlash(name))
		if err := noSymlinkParents(dest, name); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode) & os.ModePerm
		switch h.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(target); err == nil && !fi.IsDir() {
				return fmt.Errorf("%w: entry %q is not a directory already", ErrInvalid, name)
			}
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			if err := os.Chmod(target, mode|0o700); err != nil {
				return err
			}
		case tar.TypeReg:
			if sparse(h) {
				// Its holes would be written out as zeros the archive
				// does not carry: a few bytes could fill the disk.
				return fmt.Errorf("%w: entry %q is a sparse file", ErrInvalid, name)
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		default:
			// Devices, hard links, fifos: not what a COPY of a project
			// needs.
		}
	}
}

// sparse reports whether h is a sparse file in the PAX format (the old
// GNU format has its own type, skipped).
func sparse(h *tar.Header) bool {
	for k := range h.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return true
		}
	}
	return false
}

// noSymlinkParents refuses a path under root whose parent directories
// include a symlink: writing there could land outside root.
func noSymlinkParents(root, name string) error {
	dir := root
	parts := strings.Split(name, "/")
	for _, p := range parts[:len(parts)-1] {
		dir = filepath.Join(dir, p)
		fi, err := os.Lstat(dir)
		if os.IsNotExist(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			return fmt.Errorf("%w: entry %q is under a symlink", ErrInvalid, name)
		}
	}
	return nil
}
