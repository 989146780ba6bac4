package buildspec

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestPackContextRoundTrip: what PackContext writes, UnpackContext
// gives back: files with their contents and modes, directories, symlinks.
func TestPackContextRoundTrip(t *testing.T) {
	src := t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a", "b", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "top.txt"), []byte("top"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a/b/run.sh", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := PackContext(&buf, src); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "out")
	if err := UnpackContext(&buf, dst); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dst, "a", "b", "run.sh"))
	if err != nil || string(got) != "#!/bin/sh\necho hi\n" {
		t.Fatalf("run.sh = %q, %v", got, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "a", "b", "run.sh")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("run.sh mode %v, %v; want 0755", fi.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "link")); err != nil || l != "a/b/run.sh" {
		t.Fatalf("link -> %q, %v", l, err)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "top.txt")); string(got) != "top" {
		t.Fatalf("top.txt = %q", got)
	}
}
