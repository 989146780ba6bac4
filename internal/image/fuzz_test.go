package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/aenvhq/aenv/internal/testutil"
)

// fuzzLayerBudget bounds what a fuzzed layer may unpack to.
const fuzzLayerBudget = 1 << 20

// escapeProbe starts the host paths the seeds whose symbolic links are
// absolute would write to if links were followed out of the root.
var escapeProbe = filepath.Join(os.TempDir(), "aenv-unpack-escape-probe")

// FuzzUnpackLayer feeds arbitrary bytes to the layer unpacker as a layer
// (tar, gzip or zstd), under a budget: it may refuse them, but must not
// panic or hang, write anything outside the root it unpacks into, whatever
// the entries' names, links and symlinks say, nor write more file content
// than the budget, holes of sparse files included.
func FuzzUnpackLayer(f *testing.F) {
	testutil.RequireRoot(f) // chown, mknod; and trees of mode 0 must be removable
	over := strings.Repeat("\x00", fuzzLayerBudget+1)
	for _, entries := range [][]ent{
		{dir("a/"), file("a/b", "content"), symlink("a/l", "b"), hardlink("a/h", "a/b")},
		{file("../escape", "x")},
		{symlink("l", "/"), file("l"+escapeProbe, "x")},
		{symlink("l", "../.."), file("l/x", "x"), dir("l/d/")},
		{symlink("l", ".."), hardlink("h", "l/outside")},
		{hardlink("h", "../outside")},
		{symlink("var/run", escapeProbe+"-dangling/run"), file("var/run/pid", "1")},
		{symlink("s", "s"), file("s/x", "loop")},
		{dir("d/"), file("d/kept", "x"), file("d/.wh..wh..opq", ""), file(".wh.gone", ""), file(".wh.d", "")},
		{{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3}, {name: "fifo", typ: tar.TypeFifo, mode: 0o600}},
		{{name: "cap", typ: tar.TypeReg, mode: 0o755, uid: 1000, gid: 1000, body: []byte("x"),
			xattrs: map[string]string{"security.capability": "\x01\x00\x00\x02", "user.k": "v"}}},
		{{name: "suid", typ: tar.TypeReg, mode: 0o6755, uid: 1000, body: []byte("x")}, dir("./")},
		{file("big", over)},
		{file("half1", over[:fuzzLayerBudget/2]), file("half2", over[:fuzzLayerBudget/2]), file("more", "x")},
	} {
		plain := tarOf(f, entries...)
		f.Add(plain)
		f.Add(gzipped(f, plain, 6))
	}
	zs, err := zstd.NewWriter(nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(zs.EncodeAll(tarOf(f, file("z", "zstd")), nil))
	// A sparse file larger than the budget, all hole, in 2.5 KiB of tar.
	sparse := testutil.SparseTar(f, "sparse", 64<<20)
	f.Add(sparse)
	f.Add(gzipped(f, sparse, 9))

	f.Fuzz(func(t *testing.T, layer []byte) {
		dir := t.TempDir()
		// The root is two levels down, so that a write one or two
		// levels out of it still lands where this test looks.
		jail := filepath.Join(dir, "a", "b")
		root := filepath.Join(jail, "root")
		canary := filepath.Join(jail, "outside")
		canaryDir := filepath.Join(dir, "outside-dir")
		for _, d := range []string{root, canaryDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(canary, []byte("untouched"), 0o644); err != nil {
			t.Fatal(err)
		}
		canaryInfo, err := os.Lstat(canary)
		if err != nil {
			t.Fatal(err)
		}
		r, err := openRoot(root)
		if err != nil {
			t.Fatal(err)
		}
		defer r.close()
		u := newUnpacker(r, slog.New(slog.DiscardHandler))
		limit := &budget{max: fuzzLayerBudget, what: "unpacked"}
		_ = unpackLayer(context.Background(), u, bytes.NewReader(layer), limit)

		// Outside the root: exactly what was there before.
		want := map[string]bool{"a": true, "a/b": true, "a/b/root": true, "a/b/outside": true, "outside-dir": true}
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if p == root {
				return filepath.SkipDir
			}
			if rel, _ := filepath.Rel(dir, p); rel != "." && !want[rel] {
				t.Errorf("unpacking wrote %s outside the root", rel)
			}
			return nil
		})
		if escaped, _ := filepath.Glob(escapeProbe + "*"); len(escaped) > 0 {
			for _, p := range escaped {
				os.RemoveAll(p)
			}
			t.Errorf("unpacking followed a link out of the root to %v", escaped)
		}
		if b, err := os.ReadFile(canary); err != nil || string(b) != "untouched" {
			t.Errorf("unpacking changed a file outside the root: %q, %v", b, err)
		}
		if st, err := os.Lstat(canary); err != nil {
			t.Errorf("the file outside the root: %v", err)
		} else if links := st.Sys().(*syscall.Stat_t).Nlink; links != 1 || st.Mode() != canaryInfo.Mode() {
			t.Errorf("unpacking linked or changed the file outside the root: %d links, mode %v", links, st.Mode())
		}

		// Inside: no file is the one outside, and the files' content
		// (each inode once) is within the budget.
		var total int64
		seen := map[uint64]bool{}
		filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			fi, err := d.Info()
			if err != nil {
				return nil
			}
			if os.SameFile(fi, canaryInfo) {
				t.Errorf("%s is a hard link to the file outside the root", p)
			}
			if ino := fi.Sys().(*syscall.Stat_t).Ino; !seen[ino] {
				seen[ino] = true
				total += fi.Size()
			}
			return nil
		})
		if total > fuzzLayerBudget {
			t.Errorf("unpacking under a budget of %d bytes wrote %d bytes of files", fuzzLayerBudget, total)
		}
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
