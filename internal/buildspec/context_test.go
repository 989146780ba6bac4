package buildspec

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func tarball(t testing.TB, gz bool, entries ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	var zw *gzip.Writer
	tw := tar.NewWriter(&buf)
	if gz {
		zw = gzip.NewWriter(&buf)
		tw = tar.NewWriter(zw)
	}
	for _, h := range entries {
		body := []byte(h.Linkname)
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
			h.Linkname = ""
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(body)
		}
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

func TestUnpackContext(t *testing.T) {
	dir := t.TempDir()
	good := tarball(t, true,
		tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "app/main.py", Typeflag: tar.TypeReg, Mode: 0o640, Linkname: "print(1)"},
		tar.Header{Name: "app/link", Typeflag: tar.TypeSymlink, Linkname: "main.py"},
	)
	dest := filepath.Join(dir, "good")
	if err := UnpackContext(bytes.NewReader(good), dest); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "app/link")); err != nil || string(b) != "print(1)" {
		t.Fatalf("app/link = %q, %v", b, err)
	}
	outside := filepath.Join(dir, "outside")
	os.Mkdir(outside, 0o755)
	for name, bad := range map[string][]byte{
		"dotdot": tarball(t, false, tar.Header{Name: "../x", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}),
		"through-symlink": tarball(t, false,
			tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			tar.Header{Name: "l/x", Typeflag: tar.TypeReg, Mode: 0o644, Linkname: "x"}),
		"dir-over-symlink": tarball(t, false,
			tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			tar.Header{Name: "l/", Typeflag: tar.TypeDir, Mode: 0o777}),
	} {
		dest := filepath.Join(dir, name)
		if err := UnpackContext(bytes.NewReader(bad), dest); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Errorf("%s: partial context left", name)
		}
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Fatalf("files written outside: %v", left)
	}
	if fi, _ := os.Stat(outside); fi.Mode().Perm() != 0o755 {
		t.Fatalf("outside dir mode changed: %v", fi.Mode())
	}
}
