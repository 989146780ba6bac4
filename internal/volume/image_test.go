package volume

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/aenvhq/aenv/internal/testutil"
)

func openImages(t *testing.T) *Dir {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.ext4", "")
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.UnmountAll(); err != nil {
			t.Errorf("unmounting: %v", err)
		}
	})
	return d
}

// fill writes zeros into p until the file system refuses, and returns
// how much it took.
func fill(t *testing.T, p string) (int64, error) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < 1<<30 {
		k, err := f.Write(buf)
		n += int64(k)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// TestImageVolume: a volume with a size is an ext4 image that holds that
// much and no more, owned by the sandbox user and empty when new; it
// survives an unmount (a reboot) and moves to another directory with its
// size; deleting it leaves no mount, image or directory.
func TestImageVolume(t *testing.T) {
	d := openImages(t)
	const size = 32 << 20
	p, err := d.Create("sized", size)
	if err != nil {
		t.Fatal(err)
	}
	if !mounted(p) || d.Size("sized") != size {
		t.Fatalf("a sized volume: mounted %v, size %d", mounted(p), d.Size("sized"))
	}
	fi, _ := os.Stat(p)
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != DefaultUID || st.Gid != DefaultGID {
		t.Fatalf("the volume's root is owned by %d:%d", st.Uid, st.Gid)
	}
	if entries, _ := os.ReadDir(p); len(entries) != 0 {
		t.Fatalf("a new volume holds %v", entries)
	}
	n, err := fill(t, filepath.Join(p, "zeros"))
	if !errors.Is(err, syscall.ENOSPC) || n > size || n < size*3/4 {
		t.Fatalf("writing into a %d-byte volume: %d bytes, then %v", size, n, err)
	}
	if fi, _ := os.Stat(d.image("sized")); fi.Size() != size {
		t.Fatalf("the image grew to %d bytes", fi.Size())
	}
	os.WriteFile(filepath.Join(p, "zeros"), []byte("small now"), 0o644)
	// Through the data plane too: 507, and no half file left.
	ts := httptest.NewServer(d.Content())
	defer ts.Close()
	if code, body := do(t, ts, "PUT", "/volumecontent/sized/file?path=/big", make([]byte, size)); code != http.StatusInsufficientStorage {
		t.Fatalf("a file larger than the volume through the data plane: %d %s", code, body)
	}
	if entries, _ := os.ReadDir(p); len(entries) != 1 {
		t.Fatalf("after a refused upload the volume holds %v", entries)
	}

	// A reboot unmounts it; the next use mounts it again, files kept.
	must(t, d.UnmountAll())
	if mounted(p) {
		t.Fatal("still mounted after UnmountAll")
	}
	must(t, d.MountAll())
	if b, err := os.ReadFile(filepath.Join(p, "zeros")); err != nil || string(b) != "small now" {
		t.Fatalf("after a remount: %q %v", b, err)
	}
	must(t, d.UnmountAll())
	if _, err := d.Get("sized"); err != nil || !mounted(p) {
		t.Fatalf("Get of an unmounted volume: %v, mounted %v", err, mounted(p))
	}
	if _, err := d.Get("sized"); err != nil || strings.Count(mountinfo(t), p+" ") != 1 {
		t.Fatalf("a second Get: %v; mounts of %s:\n%s", err, p, mountinfo(t))
	}

	// It moves with its size.
	var buf bytes.Buffer
	if _, err := d.Archive("sized", &buf); err != nil {
		t.Fatal(err)
	}
	to := openImages(t)
	must(t, to.Extract("sized", &buf, d.Size("sized")))
	q, err := to.Get("sized")
	if err != nil || !mounted(q) || to.Size("sized") != size {
		t.Fatalf("the moved volume: %v, mounted %v, size %d", err, mounted(q), to.Size("sized"))
	}
	if b, err := os.ReadFile(filepath.Join(q, "zeros")); err != nil || string(b) != "small now" {
		t.Fatalf("the moved volume's file: %q %v", b, err)
	}

	must(t, d.Delete("sized"))
	if d.Exists("sized") || strings.Contains(mountinfo(t), p+" ") {
		t.Fatal("a deleted volume is still there or mounted")
	}
	for _, f := range []string{p, d.image("sized")} {
		if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s is left after delete: %v", f, err)
		}
	}
}

// TestPlainVolume: a volume without a size is a plain directory as
// before, and sizes out of bounds are refused.
func TestPlainVolume(t *testing.T) {
	d := openImages(t)
	p, err := d.Create("plain", 0)
	if err != nil || mounted(p) || d.Size("plain") != 0 {
		t.Fatalf("a plain volume: %v, mounted %v, size %d", err, mounted(p), d.Size("plain"))
	}
	if got, err := d.Get("plain"); err != nil || got != p {
		t.Fatalf("Get: %q %v", got, err)
	}
	must(t, d.MountAll())
	if mounted(p) {
		t.Fatal("MountAll mounted a plain volume")
	}
	for _, size := range []int64{1 << 20, -1, MaxSize + 1} {
		if _, err := d.Create("bad", size); !errors.Is(err, ErrInvalid) {
			t.Fatalf("a volume of %d bytes: %v", size, err)
		}
	}
	if d.Exists("bad") {
		t.Fatal("a refused volume exists")
	}
	must(t, d.Delete("plain"))
	if d.Exists("plain") {
		t.Fatal("a deleted plain volume exists")
	}
}

func mountinfo(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, _ := io.ReadAll(f)
	return string(b)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
