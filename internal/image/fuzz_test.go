package image

import (
	"archive/tar"
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzUnpackLayer feeds arbitrary bytes to the layer unpacker as a layer
// (tar, gzip or zstd): it may refuse them, but must not panic, hang or
// write anything outside the root it unpacks into, whatever the entries'
// names, links and symlinks say.
func FuzzUnpackLayer(f *testing.F) {
	for _, entries := range [][]tar.Header{
		{{Name: "a/b", Typeflag: tar.TypeReg, Mode: 0o644}},
		{{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}},
		{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, {Name: "l/etc/x", Typeflag: tar.TypeReg}},
		{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../.."}, {Name: "l/x", Typeflag: tar.TypeReg}},
		{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}},
		{{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "d/.wh..wh..opq", Typeflag: tar.TypeReg}},
		{{Name: ".wh.gone", Typeflag: tar.TypeReg}},
	} {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			h.Size = 0
			tw.WriteHeader(&h)
		}
		tw.Close()
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, layer []byte) {
		if os.Geteuid() != 0 {
			t.Skip("unpacking needs root (chown, mknod)")
		}
		dir := t.TempDir()
		root := filepath.Join(dir, "root")
		os.Mkdir(root, 0o755)
		canary := filepath.Join(dir, "outside")
		os.WriteFile(canary, []byte("untouched"), 0o644)
		r, err := openRoot(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.close()
		u := newUnpacker(r, slog.New(slog.DiscardHandler))
		_ = unpackLayer(context.Background(), u, bytes.NewReader(layer), nil)
		_ = u.endLayer()
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.Name() != "root" && e.Name() != "outside" {
				t.Fatalf("unpacking wrote %s outside the root", e.Name())
			}
		}
		if b, err := os.ReadFile(canary); err != nil || string(b) != "untouched" {
			t.Fatalf("unpacking changed a file outside the root: %q, %v", b, err)
		}
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && strings.Contains(p, "..") && !strings.HasPrefix(p, root) {
				t.Fatalf("entry %s outside the root", p)
			}
			return nil
		})
	})
}

// FuzzCleanPath: a layer entry's name is either refused or cleaned into a
// relative path that stays inside the root.
func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"a/b", "./a/../b", "../x", "/abs", "a\x00b", ".wh..wh..opq", "//a//b/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		got, err := cleanPath(name)
		if err != nil {
			return
		}
		if strings.HasPrefix(got, "/") || got == ".." || strings.HasPrefix(got, "../") || strings.Contains(got, "/../") ||
			strings.HasSuffix(got, "/..") || strings.ContainsRune(got, 0) {
			t.Fatalf("cleanPath(%q) = %q, which leaves the root", name, got)
		}
	})
}
