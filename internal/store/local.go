package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// tmpPrefix marks files that a Put is still writing; List skips them and
// validKey forbids keys that could name them.
const tmpPrefix = ".tmp-"

// Local is a Backend on a directory: local disk or a shared filesystem
// mounted on every node. Objects are files under the root; a Put writes a
// temporary file, fsyncs it, renames it into place and fsyncs the directory,
// so a crash leaves either the old object or the new one.
type Local struct {
	root string
}

// NewLocal returns a backend rooted at dir, creating dir if needed.
func NewLocal(dir string) (*Local, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("opening local store %q: path must be absolute", dir)
	}
	dir = filepath.Clean(dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("opening local store %s: %w", dir, err)
	}
	return &Local{root: dir}, nil
}

// String implements Backend.
func (l *Local) String() string { return "file://" + l.root }

func (l *Local) path(key string) (string, error) {
	if err := validKey(key); err != nil {
		return "", err
	}
	return filepath.Join(l.root, filepath.FromSlash(key)), nil
}

// Put implements Backend.
func (l *Local) Put(ctx context.Context, key string, r io.Reader, size int64) (err error) {
	p, err := l.path(key)
	if err != nil {
		return fmt.Errorf("putting %s: %w", key, err)
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("putting %s in %s: %w", key, l, err)
		}
	}()
	dir := filepath.Dir(p)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, tmpPrefix+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	n, err := io.Copy(f, io.LimitReader(ctxReader{ctx, r}, size+1))
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("reader gave %d bytes, want %d", n, size)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		return err
	}
	return syncDir(dir)
}

// Get implements Backend.
func (l *Local) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	p, err := l.path(key)
	if err != nil {
		return nil, fmt.Errorf("getting %s: %w", key, err)
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, fmt.Errorf("getting %s from %s: %w", key, l, mapNotExist(err))
	}
	return f, nil
}

// Stat implements Backend.
func (l *Local) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	p, err := l.path(key)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("statting %s: %w", key, err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("statting %s in %s: %w", key, l, mapNotExist(err))
	}
	if !fi.Mode().IsRegular() {
		return ObjectInfo{}, fmt.Errorf("statting %s in %s: %w", key, l, ErrNotFound)
	}
	return ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// Delete implements Backend. Directories left empty are removed so that a
// store of deleted snapshots does not keep a directory per snapshot.
func (l *Local) Delete(ctx context.Context, key string) error {
	p, err := l.path(key)
	if err != nil {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("deleting %s from %s: %w", key, l, err)
	}
	for dir := filepath.Dir(p); dir != l.root && strings.HasPrefix(dir, l.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil { // not empty, or gone: either way stop
			break
		}
	}
	return nil
}

// List implements Backend.
func (l *Local) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	// Walk only the deepest directory the prefix is sure to be under.
	start := l.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		if err := validKey(prefix[:i]); err != nil {
			return nil, fmt.Errorf("listing %q: %w", prefix, err)
		}
		start = filepath.Join(l.root, filepath.FromSlash(prefix[:i]))
	}
	var out []ObjectInfo
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // the prefix's directory does not exist, or vanished
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), tmpPrefix) || !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(l.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted while we walked
		}
		if err != nil {
			return err
		}
		out = append(out, ObjectInfo{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing %q in %s: %w", prefix, l, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// RemoveStaleTemps deletes temporary files older than age: those of Puts
// that a crash interrupted. GC calls it; a younger one may belong to a Put
// in flight.
func (l *Local) RemoveStaleTemps(ctx context.Context, age time.Duration) (int, error) {
	n := 0
	cutoff := time.Now().Add(-age)
	err := filepath.WalkDir(l.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() || !strings.HasPrefix(d.Name(), tmpPrefix) {
			return nil
		}
		if fi, err := d.Info(); err == nil && fi.ModTime().Before(cutoff) {
			if os.Remove(p) == nil {
				n++
			}
		}
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("removing stale temporary files in %s: %w", l, err)
	}
	return n, nil
}

func mapNotExist(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ctxReader stops a long copy when its context is cancelled.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
