package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// rootFS is a directory tree that paths are resolved in as if it were "/":
// every lookup goes through openat2(RESOLVE_IN_ROOT), so a symbolic link
// in the tree (absolute or full of "..") can never lead a write outside it,
// and each entry is then created relative to its parent's descriptor,
// without following a link in its last element.
type rootFS struct {
	f    *os.File
	path string
}

func openRoot(dir string) (*rootFS, error) {
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fmt.Errorf("opening root filesystem: %w", err)
	}
	return &rootFS{f: f, path: dir}, nil
}

func (r *rootFS) close() { r.f.Close() }

// open opens rel, resolving every symbolic link on the way inside the root.
func (r *rootFS) open(rel string, flags int, mode uint32) (*os.File, error) {
	if rel == "" {
		rel = "."
	}
	how := &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	}
	var fd int
	var err error
	for range 16 {
		// EAGAIN: a concurrent rename raced the lookup; only we write
		// here, but the kernel may still ask.
		fd, err = unix.Openat2(int(r.f.Fd()), rel, how)
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return nil, fmt.Errorf("opening %s: openat2 is not available (Linux 5.6 or later is needed): %w", rel, err)
		}
		return nil, &os.PathError{Op: "open", Path: "/" + strings.TrimPrefix(rel, "."), Err: err}
	}
	return os.NewFile(uintptr(fd), path.Join(r.path, rel)), nil
}

// openDir opens directory rel; with create, missing directories on the
// way are made (root-owned, 0755), as tar extractors do, also where a
// dangling symbolic link points (e.g. var/run -> /run without /run).
func (r *rootFS) openDir(rel string, create bool) (*os.File, error) {
	d, err := r.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err == nil || !create || !errors.Is(err, unix.ENOENT) {
		return d, err
	}
	return r.mkdirAll(rel, 0)
}

// maxLinkHops bounds how many dangling links mkdirAll follows, as the
// kernel bounds symbolic link resolution.
const maxLinkHops = 40

func (r *rootFS) mkdirAll(rel string, hops int) (*os.File, error) {
	if hops > maxLinkHops {
		return nil, &os.PathError{Op: "mkdir", Path: "/" + rel, Err: unix.ELOOP}
	}
	parts := strings.Split(rel, "/")
	for i := range parts {
		prefix := strings.Join(parts[:i+1], "/")
		d, err := r.open(prefix, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err == nil {
			d.Close()
			continue
		}
		if !errors.Is(err, unix.ENOENT) {
			return nil, err
		}
		parent, err := r.open(strings.Join(parts[:i], "/"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, err
		}
		err = unix.Mkdirat(int(parent.Fd()), parts[i], 0o755)
		if err == nil {
			parent.Close()
			continue
		}
		if !errors.Is(err, unix.EEXIST) {
			parent.Close()
			return nil, &os.PathError{Op: "mkdir", Path: "/" + prefix, Err: err}
		}
		// Something is there yet cannot be opened: a dangling link.
		// Carry on from where it points, inside the root.
		target, lerr := readlinkAt(int(parent.Fd()), parts[i])
		if lerr != nil {
			parent.Close()
			return nil, &os.PathError{Op: "mkdir", Path: "/" + prefix, Err: err}
		}
		if !path.IsAbs(target) {
			where, err := r.relPath(parent)
			if err != nil {
				parent.Close()
				return nil, err
			}
			target = path.Join("/", where, target)
		}
		parent.Close()
		next := strings.TrimPrefix(path.Join(append([]string{"/", target}, parts[i+1:]...)...), "/")
		return r.mkdirAll(next, hops+1)
	}
	return r.open(rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
}

// relPath says where an open directory of the tree really is, relative
// to the root.
func (r *rootFS) relPath(d *os.File) (string, error) {
	rootPath, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", r.f.Fd()))
	if err != nil {
		return "", err
	}
	p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", d.Fd()))
	if err != nil {
		return "", err
	}
	if p != rootPath && !strings.HasPrefix(p, rootPath+"/") {
		return "", fmt.Errorf("directory %s is outside the root %s", p, rootPath)
	}
	return strings.TrimPrefix(strings.TrimPrefix(p, rootPath), "/"), nil
}

func readlinkAt(dirfd int, name string) (string, error) {
	buf := make([]byte, 4096)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// unpacker applies layers to a rootFS.
type unpacker struct {
	root  *rootFS
	log   *slog.Logger
	owner bool // keep owners and make device nodes (needs root)
	buf   []byte
	layer layerState
	// skipped counts what could not be recreated (device nodes without
	// root, extended attributes the filesystem refuses).
	skippedDevices, skippedXattrs int
}

func newUnpacker(root *rootFS, log *slog.Logger) *unpacker {
	return &unpacker{root: root, log: log, owner: isRoot(), buf: make([]byte, 1<<20)}
}

// create makes rel (in dir, named base) as hdr describes, replacing what
// lower layers had there unless both are directories.
func (u *unpacker) create(dir, base, rel string, hdr *tar.Header, r io.Reader) error {
	parent, err := u.root.openDir(dir, true)
	if err != nil {
		return fmt.Errorf("creating %s: %w", rel, err)
	}
	defer parent.Close()
	pfd := int(parent.Fd())

	var st unix.Stat_t
	switch err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); {
	case err == nil:
		if st.Mode&unix.S_IFMT == unix.S_IFDIR && hdr.Typeflag == tar.TypeDir {
			return u.setMeta(pfd, base, rel, hdr)
		}
		if err := removeAt(pfd, base); err != nil {
			return fmt.Errorf("replacing %s: %w", rel, err)
		}
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("creating %s: %w", rel, err)
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
			return fmt.Errorf("creating %s: %w", rel, err)
		}
		return u.setMeta(pfd, base, rel, hdr)
	case tar.TypeReg, tar.TypeGNUSparse, '\x00':
		return u.writeFile(pfd, base, rel, hdr, r)
	case tar.TypeSymlink:
		if err := unix.Symlinkat(hdr.Linkname, pfd, base); err != nil {
			return fmt.Errorf("creating %s: %w", rel, err)
		}
		return u.setMeta(pfd, base, rel, hdr)
	case tar.TypeLink:
		target, err := cleanPath(hdr.Linkname)
		if err != nil {
			return err
		}
		if target == "" {
			return fmt.Errorf("%w: hard link %q to the root", ErrUnsafeLayer, hdr.Name)
		}
		tdir, tbase := splitPath(target)
		tparent, err := u.root.openDir(tdir, false)
		if err != nil {
			return fmt.Errorf("linking %s to %s: %w", rel, target, err)
		}
		err = unix.Linkat(int(tparent.Fd()), tbase, pfd, base, 0)
		tparent.Close()
		if err != nil {
			return fmt.Errorf("linking %s to %s: %w", rel, target, err)
		}
		return nil
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		mode := uint32(hdr.Mode) & 0o7777
		switch hdr.Typeflag {
		case tar.TypeChar:
			mode |= unix.S_IFCHR
		case tar.TypeBlock:
			mode |= unix.S_IFBLK
		default:
			mode |= unix.S_IFIFO
		}
		dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
		if err := unix.Mknodat(pfd, base, mode, int(dev)); err != nil {
			if errors.Is(err, unix.EPERM) && hdr.Typeflag != tar.TypeFifo {
				u.skippedDevices++
				return nil
			}
			return fmt.Errorf("creating %s: %w", rel, err)
		}
		return u.setMeta(pfd, base, rel, hdr)
	default:
		u.log.Debug("skipping tar entry of unknown type", "path", rel, "type", string(hdr.Typeflag))
		return nil
	}
}

// writeFile creates regular file base in pfd with r's content.
func (u *unpacker) writeFile(pfd int, base, rel string, hdr *tar.Header, r io.Reader) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	// Hide ReadFrom: it would copy through a 32 KiB buffer.
	if _, err := io.CopyBuffer(struct{ io.Writer }{f}, r, u.buf); err != nil {
		return fmt.Errorf("writing %s: %w", rel, err)
	}
	if u.owner {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("writing %s: %w", rel, err)
		}
	}
	// After chown, which clears set-id bits.
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o7777); err != nil {
		return fmt.Errorf("writing %s: %w", rel, err)
	}
	u.setXattrs(fd, hdr)
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", rel, err)
	}
	return setTimes(pfd, base, hdr)
}

// setMeta gives a directory, symbolic link or device node its owner, mode,
// extended attributes and times (directories' times once the layer is
// done).
func (u *unpacker) setMeta(pfd int, base, rel string, hdr *tar.Header) error {
	if u.owner {
		if err := unix.Fchownat(pfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("setting owner of %s: %w", rel, err)
		}
	}
	if hdr.Typeflag == tar.TypeSymlink {
		return setTimes(pfd, base, hdr)
	}
	// Not a link (checked by the caller), so following is harmless.
	if err := unix.Fchmodat(pfd, base, uint32(hdr.Mode)&0o7777, 0); err != nil {
		return fmt.Errorf("setting mode of %s: %w", rel, err)
	}
	if hdr.Typeflag == tar.TypeDir {
		if hasXattrs(hdr) {
			fd, err := unix.Openat(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err == nil {
				u.setXattrs(fd, hdr)
				unix.Close(fd)
			}
		}
		u.layer.dirTimes = append(u.layer.dirTimes, dirTime{rel: rel, header: hdr})
		return nil
	}
	return setTimes(pfd, base, hdr)
}

// rootMeta applies the layer's entry for "/" to the root directory.
func (u *unpacker) rootMeta(hdr *tar.Header) error {
	fd := int(u.root.f.Fd())
	if u.owner {
		if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
			return fmt.Errorf("setting owner of /: %w", err)
		}
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode)&0o7777); err != nil {
		return fmt.Errorf("setting mode of /: %w", err)
	}
	return nil
}

// endLayer sets the times of the layer's directories and reports what was
// skipped.
func (u *unpacker) endLayer() error {
	for _, d := range u.layer.dirTimes {
		dir, base := splitPath(d.rel)
		parent, err := u.root.openDir(dir, false)
		if err != nil {
			continue // removed later in the same layer
		}
		_ = setTimes(int(parent.Fd()), base, d.header)
		parent.Close()
	}
	if u.skippedDevices > 0 || u.skippedXattrs > 0 {
		u.log.Debug("layer applied with omissions", "device_nodes_skipped", u.skippedDevices, "xattrs_skipped", u.skippedXattrs)
	}
	return nil
}

// whiteout deletes dir/name, which a lower layer made.
func (u *unpacker) whiteout(dir, name string) error {
	parent, err := u.root.openDir(dir, false)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("applying whiteout of %s: %w", path.Join(dir, name), err)
	}
	defer parent.Close()
	if err := removeAt(int(parent.Fd()), name); err != nil {
		return fmt.Errorf("applying whiteout of %s: %w", path.Join(dir, name), err)
	}
	return nil
}

// opaque empties dir of what lower layers put there.
func (u *unpacker) opaque(dir string) error {
	d, err := u.root.openDir(dir, false)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("making %s opaque: %w", dir, err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("making %s opaque: %w", dir, err)
	}
	for _, n := range names {
		if u.wasSeen(path.Join(dir, n)) {
			continue
		}
		if err := removeAt(int(d.Fd()), n); err != nil {
			return fmt.Errorf("making %s opaque: %w", dir, err)
		}
	}
	return nil
}

// removeAt deletes name in dirfd, recursively, never following links.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(fd), name)
	names, err := d.Readdirnames(-1)
	if err != nil {
		d.Close()
		return err
	}
	for _, n := range names {
		if err := removeAt(fd, n); err != nil {
			d.Close()
			return err
		}
	}
	d.Close()
	err = unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

func hasXattrs(hdr *tar.Header) bool {
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, xattrPrefix) {
			return true
		}
	}
	return false
}

// setXattrs restores extended attributes (file capabilities, ACLs) on fd;
// ones the filesystem refuses are counted and skipped.
func (u *unpacker) setXattrs(fd int, hdr *tar.Header) {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPrefix)
		if !ok {
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil {
			u.skippedXattrs++
		}
	}
}

// setTimes sets base's access and modification times from hdr.
func setTimes(pfd int, base string, hdr *tar.Header) error {
	mtime := hdr.ModTime
	atime := hdr.AccessTime
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("setting times of %s: %w", base, err)
	}
	return nil
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{Sec: 0}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

// readFile reads rel; a missing file reads as nil with exists false.
func (r *rootFS) readFile(rel string) (data []byte, exists bool, err error) {
	f, err := r.open(rel, unix.O_RDONLY, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	data, err = io.ReadAll(io.LimitReader(f, 64<<20))
	return data, true, err
}

// writeFile replaces rel's content, creating it (root-owned, perm) and
// its directory if needed; an existing file keeps its owner and mode.
func (r *rootFS) writeFile(rel string, data []byte, perm uint32) error {
	dir, _ := splitPath(rel)
	d, err := r.openDir(dir, true)
	if err != nil {
		return err
	}
	d.Close()
	f, err := r.open(rel, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// isExecutable reports whether rel (following links inside the root) is
// a regular file someone may execute.
func (r *rootFS) isExecutable(rel string) bool {
	f, err := r.open(rel, unix.O_PATH, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFREG && st.Mode&0o111 != 0
}

// exists reports whether rel exists (following links inside the root).
func (r *rootFS) exists(rel string) bool {
	f, err := r.open(rel, unix.O_PATH, 0)
	if err != nil {
		return false
	}
	f.Close()
	return true
}

// mkdirOwned creates directory rel owned by uid:gid unless something is
// there already; it reports whether it created it.
func (r *rootFS) mkdirOwned(rel string, uid, gid int, perm uint32) (bool, error) {
	if r.exists(rel) {
		return false, nil
	}
	dir, base := splitPath(rel)
	parent, err := r.openDir(dir, true)
	if err != nil {
		return false, err
	}
	defer parent.Close()
	pfd := int(parent.Fd())
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		return false, &os.PathError{Op: "mkdir", Path: "/" + rel, Err: err}
	}
	if isRoot() {
		if err := unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return true, &os.PathError{Op: "chown", Path: "/" + rel, Err: err}
		}
	}
	if err := unix.Fchmodat(pfd, base, perm, 0); err != nil {
		return true, &os.PathError{Op: "chmod", Path: "/" + rel, Err: err}
	}
	return true, nil
}

// copyTopFiles copies the regular files directly in directory src into
// directory dst, owned by uid:gid (how useradd fills a home from
// /etc/skel).
func (r *rootFS) copyTopFiles(src, dst string, uid, gid int) error {
	d, err := r.openDir(src, false)
	if err != nil {
		return nil // no skeleton
	}
	entries, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		data, _, err := r.readFile(path.Join(src, e.Name()))
		if err != nil {
			return err
		}
		target := path.Join(dst, e.Name())
		if r.exists(target) {
			continue
		}
		if err := r.writeFile(target, data, 0o644); err != nil {
			return err
		}
		if isRoot() {
			f, err := r.open(target, unix.O_RDONLY|unix.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			err = unix.Fchown(int(f.Fd()), uid, gid)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}
