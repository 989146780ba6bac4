package buildspec

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/testutil"
)

// FuzzParse: any Dockerfile text either parses or is refused with an
// error; the parser never panics, and what it accepts has a FROM.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		"FROM base\nRUN echo hi\n",
		"ARG V=1\nFROM base\nENV A=$V B=\"x y\"\nWORKDIR /w\nUSER user\nCOPY --chown=user a b /d/\nCMD [\"sh\"]\n",
		"FROM base\nRUN [\"sh\", \"-c\", \"echo \\\"q\\\"\"]\n",
		"FROM base\nRUN a \\\n  b \\\n  c\n",
		"# comment\n\nFROM base AS x\n",
		"FROM base\nADD x /x\n",
		"FROM\n",
		"RUN echo before from\n",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, text string) {
		df, err := Parse(strings.NewReader(text))
		if err == nil && (df == nil || df.From == "") {
			t.Fatalf("accepted a Dockerfile without FROM: %+v", df)
		}
	})
}

// escapeProbe is where the seed whose symlink leads to "/" would write
// if entries were unpacked through symlinks.
var escapeProbe = filepath.Join(os.TempDir(), "aenv-context-escape-probe")

// FuzzUnpackContext: an uploaded build context, whatever its entries, is
// unpacked inside its directory or refused, leaving nothing; nothing lands
// outside, only directories, regular files and symlinks are made, and the
// files hold no more bytes than the archive carries (no sparse file's
// holes written out).
func FuzzUnpackContext(f *testing.F) {
	for _, entries := range [][]tar.Header{
		{{Name: "Dockerfile", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "FROM base\n"}},
		{{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "app/main.py", Typeflag: tar.TypeReg, Mode: 0o600, Linkname: "print(1)"},
			{Name: "app/link", Typeflag: tar.TypeSymlink, Linkname: "main.py"}, {Name: "./app/sub/deep", Typeflag: tar.TypeReg, Linkname: "x"}},
		{{Name: "../x", Typeflag: tar.TypeReg}},
		{{Name: "a/../../x", Typeflag: tar.TypeReg}},
		{{Name: "/abs", Typeflag: tar.TypeReg}},
		{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: ".."}, {Name: "l/x", Typeflag: tar.TypeReg}},
		{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"}, {Name: "l" + escapeProbe, Typeflag: tar.TypeReg, Linkname: "x"}},
		{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../outside"}, {Name: "l/", Typeflag: tar.TypeDir, Mode: 0o777}},
		{{Name: "d", Typeflag: tar.TypeDir}, {Name: "d", Typeflag: tar.TypeReg}},
		{{Name: "f", Typeflag: tar.TypeReg, Linkname: "x"}, {Name: "f/", Typeflag: tar.TypeDir}},
		{{Name: "h", Typeflag: tar.TypeLink, Linkname: "../outside/canary"}, {Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		{{Name: "locked/", Typeflag: tar.TypeDir, Mode: 0}, {Name: "locked/f", Typeflag: tar.TypeReg, Mode: 0, Linkname: "x"}},
	} {
		archive := tarball(f, false, entries...)
		f.Add(archive)
		f.Add(tarball(f, true, entries...))
	}
	sparse := testutil.SparseTar(f, "sparse", 64<<20)
	f.Add(sparse)
	f.Add(gzipped(f, sparse))
	f.Fuzz(func(t *testing.T, archive []byte) {
		dir := t.TempDir()
		dest := filepath.Join(dir, "ctx")
		outside := filepath.Join(dir, "outside")
		if err := os.Mkdir(outside, 0o755); err != nil {
			t.Fatal(err)
		}
		canary := filepath.Join(outside, "canary")
		if err := os.WriteFile(canary, []byte("untouched"), 0o644); err != nil {
			t.Fatal(err)
		}
		err := UnpackContext(bytes.NewReader(archive), dest)

		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if e.Name() != "ctx" && e.Name() != "outside" {
				t.Errorf("unpacking wrote %s outside the context", e.Name())
			}
		}
		if left, _ := os.ReadDir(outside); len(left) != 1 {
			t.Errorf("unpacking wrote into a directory beside the context: %v", left)
		}
		if b, rerr := os.ReadFile(canary); rerr != nil || string(b) != "untouched" {
			t.Errorf("unpacking changed a file beside the context: %q, %v", b, rerr)
		}
		if _, lerr := os.Lstat(escapeProbe); lerr == nil {
			os.Remove(escapeProbe)
			t.Errorf("unpacking followed a symlink out of the context to %s", escapeProbe)
		}
		if err != nil {
			if _, serr := os.Lstat(dest); !os.IsNotExist(serr) {
				t.Errorf("a refused context (%v) left its directory behind", err)
			}
			return
		}
		var files int64
		filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			switch {
			case d.Type().IsRegular():
				if fi, err := d.Info(); err == nil {
					files += fi.Size()
				}
			case d.IsDir(), d.Type()&fs.ModeSymlink != 0:
			default:
				t.Errorf("unpacking made %s, of type %v", p, d.Type())
			}
			return nil
		})
		if carried := tarBytes(archive); files > carried {
			t.Errorf("the context's files hold %d bytes, from an archive of %d bytes of tar", files, carried)
		}
	})
}

// tarBytes is how many bytes of tar an archive holds (gunzipped if it is
// gzipped, as UnpackContext reads it).
func tarBytes(archive []byte) int64 {
	zr, err := gzip.NewReader(bytes.NewReader(archive))
	if err != nil {
		return int64(len(archive))
	}
	n, _ := io.Copy(io.Discard, zr)
	return n
}

func gzipped(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
