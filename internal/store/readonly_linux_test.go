package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aenvhq/aenv/internal/testutil"
)

// readOnlyView returns a read-only view of dir: a read-only bind mount as
// root (root ignores permission bits), else dir itself made 0555.
func readOnlyView(t *testing.T, dir string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		var all []string
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for _, p := range all {
			os.Chmod(p, 0o555)
		}
		t.Cleanup(func() {
			for _, p := range all {
				os.Chmod(p, 0o755)
			}
		})
		return dir
	}
	view := t.TempDir()
	if err := syscall.Mount(dir, view, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mounting %s: %v", dir, err)
	}
	t.Cleanup(func() { syscall.Unmount(view, syscall.MNT_DETACH) })
	if err := syscall.Mount("", view, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
		t.Fatalf("remounting %s read-only: %v", view, err)
	}
	return view
}

func TestReadOnlyLocal(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	rw, err := NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Options{Backend: rw, ChunkSize: MiB})
	if _, _, err := s.Save(ctx, "ro-0", "", writeFiles(t, map[string][]byte{"mem": randomBytes(22, 2*MiB)}), nil); err != nil {
		t.Fatal(err)
	}

	rob, err := NewLocal(readOnlyView(t, dir))
	if err != nil {
		t.Fatal(err)
	}
	ros := newStore(t, Options{Backend: rob, ChunkSize: MiB})
	if err := ros.Restore(ctx, "ro-0", t.TempDir()); err != nil {
		t.Fatalf("restore from a read-only directory: %v", err)
	}
	_, _, err = ros.Save(ctx, "ro-1", "ro-0", writeFiles(t, map[string][]byte{"mem": randomBytes(23, 2*MiB)}), nil)
	if err == nil {
		t.Fatal("Save to a read-only directory succeeded")
	}
	t.Logf("read-only save: %v", err)
	if !strings.Contains(err.Error(), "saving snapshot ro-1") ||
		!(errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EACCES)) {
		t.Fatalf("error %q does not name the snapshot and the refusal", err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 1 {
		t.Fatalf("catalog after refused Save: %v, %v", list, err)
	}
}

// TestDiskFull saves onto a 2 MiB tmpfs: Save fails with ENOSPC, names the
// snapshot, and publishes nothing; the store still works once there is room.
func TestDiskFull(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		t.Fatalf("mounting tmpfs: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	b, err := NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := newStore(t, Options{Backend: b, ChunkSize: 256 << 10, Compression: CompressionNone})
	_, _, err = s.Save(ctx, "big", "", writeFiles(t, map[string][]byte{"mem": randomBytes(24, 4*MiB)}), nil)
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "saving snapshot big") {
		t.Fatalf("Save onto a full disk = %v, want ENOSPC naming the snapshot", err)
	}
	if list, err := s.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("catalog after a failed Save: %v, %v", list, err)
	}
	// Nothing half-written is left to fill the disk: GC the orphans, and a
	// small snapshot fits.
	gc := newStore(t, Options{Backend: b, GCGrace: -1})
	if _, err := gc.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Save(ctx, "small", "", writeFiles(t, map[string][]byte{"mem": randomBytes(25, 512<<10)}), nil); err != nil {
		t.Fatalf("Save after GC: %v", err)
	}
}
