package volume

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"
)

// Archive writes volume id's files to w as a tar (owners, modes, links
// kept): how a volume moves to another node. It reads through os.Root,
// like the data plane: a link a sandbox swaps in mid-walk leads nowhere
// outside the volume.
func (d *Dir) Archive(id string, w io.Writer) (int64, error) {
	p, err := d.Get(id)
	if err != nil {
		return 0, fmt.Errorf("archiving volume %s: %w", id, err)
	}
	root, err := os.OpenRoot(p)
	if err != nil {
		return 0, fmt.Errorf("archiving volume %s: %w", id, err)
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	var total int64
	err = fs.WalkDir(root.FS(), ".", func(name string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		fi, err := root.Lstat(name)
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = root.Readlink(name); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil // a socket or device: not a volume's content
		}
		h.Name = name
		if fi.IsDir() {
			h.Name += "/"
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			h.Uid, h.Gid = int(st.Uid), int(st.Gid)
		}
		h.Uname, h.Gname = "", ""
		if !fi.Mode().IsRegular() && !fi.IsDir() && fi.Mode()&fs.ModeSymlink == 0 {
			return nil // a FIFO or device: not a volume's content
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
			if err != nil {
				return err
			}
			n, err := io.CopyN(tw, f, h.Size)
			f.Close()
			total += n
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return 0, fmt.Errorf("archiving volume %s: %w", id, err)
	}
	return total, nil
}

// Extract makes volume id here from an Archive, replacing what this node
// had of it, with size as Create takes it (the size it had where it was
// archived). Every entry is written through os.Root: an archive cannot
// place anything outside the volume.
func (d *Dir) Extract(id string, r io.Reader, size int64) error {
	if err := d.Delete(id); err != nil {
		return err
	}
	p, err := d.Create(id, size)
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(p)
	if err != nil {
		return fmt.Errorf("extracting volume %s: %w", id, err)
	}
	defer root.Close()
	// Directories get their modes last: a read-only one must still take
	// its entries.
	type dirMode struct {
		name string
		mode os.FileMode
	}
	var dirs []dirMode
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			for i := len(dirs) - 1; i >= 0; i-- {
				if err := root.Chmod(dirs[i].name, dirs[i].mode); err != nil {
					return fmt.Errorf("extracting volume %s: %w", id, err)
				}
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("extracting volume %s: %w", id, err)
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if name == "" {
			continue
		}
		mode := os.FileMode(h.Mode & 0o7777)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("extracting volume %s: %w", id, err)
			}
			dirs = append(dirs, dirMode{name, mode})
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
			if err != nil {
				return fmt.Errorf("extracting volume %s: %w", id, err)
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("extracting volume %s: %w", id, err)
			}
		case tar.TypeSymlink:
			if err := root.Symlink(h.Linkname, name); err != nil {
				return fmt.Errorf("extracting volume %s: %w", id, err)
			}
		default:
			continue
		}
		if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
			return fmt.Errorf("extracting volume %s: %w", id, err)
		}
		if h.Typeflag == tar.TypeReg {
			if err := root.Chmod(name, mode); err != nil {
				return fmt.Errorf("extracting volume %s: %w", id, err)
			}
		}
	}
}
