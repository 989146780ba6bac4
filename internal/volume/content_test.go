package volume

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func newContent(t *testing.T) (*Dir, *httptest.Server) {
	t.Helper()
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		t.Fatal("the volume tests chown files to the sandbox user: run them as root (CI does)")
	}
	if _, err := d.Create("vol1", 0); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d.Content())
	t.Cleanup(ts.Close)
	return d, ts
}

func do(t *testing.T, ts *httptest.Server, method, path string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, ts.URL+path, bytes.NewReader(body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func TestContent(t *testing.T) {
	d, ts := newContent(t)
	if st, b := do(t, ts, "PUT", "/volumecontent/vol1/file?path=/data/a.txt&force=true", []byte("hello")); st != 201 {
		t.Fatalf("write: %d %s", st, b)
	}
	host, _ := d.Path("vol1")
	fi, err := os.Stat(filepath.Join(host, "data/a.txt"))
	if err != nil || fi.Size() != 5 {
		t.Fatal(err)
	}
	if st, b := do(t, ts, "GET", "/volumecontent/vol1/file?path=data/a.txt", nil); st != 200 || string(b) != "hello" {
		t.Fatalf("read: %d %q", st, b)
	}
	var e EntryStat
	_, b := do(t, ts, "GET", "/volumecontent/vol1/path?path=/data/a.txt", nil)
	json.Unmarshal(b, &e)
	if e.Type != "file" || e.Size != 5 || e.UID != DefaultUID || e.Path != "/data/a.txt" || e.Name != "a.txt" || e.Mode != 0o644 {
		t.Fatalf("stat: %+v", e)
	}
	if st, b := do(t, ts, "POST", "/volumecontent/vol1/dir?path=/data/sub/deeper&force=true&mode=448", nil); st != 201 {
		t.Fatalf("mkdir: %d %s", st, b)
	}
	if st, _ := do(t, ts, "POST", "/volumecontent/vol1/dir?path=/data/sub", nil); st != 409 {
		t.Fatalf("mkdir of an existing directory: %d, want 409", st)
	}
	var list []EntryStat
	_, b = do(t, ts, "GET", "/volumecontent/vol1/dir?path=/&depth=3", nil)
	json.Unmarshal(b, &list)
	var paths []string
	for _, x := range list {
		paths = append(paths, x.Path)
	}
	if strings.Join(paths, " ") != "/data /data/a.txt /data/sub /data/sub/deeper" {
		t.Fatalf("listing: %v", paths)
	}
	if st, b := do(t, ts, "PATCH", "/volumecontent/vol1/path?path=/data/a.txt", []byte(`{"mode":384,"uid":0}`)); st != 200 ||
		!strings.Contains(string(b), `"mode":384`) || !strings.Contains(string(b), `"uid":0`) {
		t.Fatalf("patch: %d %s", st, b)
	}

	// Nothing leaves the volume: dot-dots stay inside, and a symlink a
	// sandbox planted is not followed out.
	if st, _ := do(t, ts, "GET", "/volumecontent/vol1/file?path=../../../../etc/passwd", nil); st != 404 {
		t.Fatalf("a dot-dot path: %d, want 404 (it names /etc/passwd inside the volume)", st)
	}
	if err := os.Symlink("/etc", filepath.Join(host, "out")); err != nil {
		t.Fatal(err)
	}
	if st, b := do(t, ts, "GET", "/volumecontent/vol1/file?path=/out/passwd", nil); st != 400 {
		t.Fatalf("through a symlink out of the volume: %d %s, want 400", st, b)
	}
	if st, _ := do(t, ts, "PUT", "/volumecontent/vol1/file?path=/out/x", []byte("x")); st != 400 {
		t.Fatalf("writing through a symlink out: %d, want 400", st)
	}
	if _, err := os.Stat("/etc/x"); err == nil {
		t.Fatal("a write escaped the volume")
	}
	if st, _ := do(t, ts, "GET", "/volumecontent/vol1/file?path=/data", nil); st != 400 {
		t.Fatalf("reading a directory: %d, want 400", st)
	}
	if st, _ := do(t, ts, "GET", "/volumecontent/vol1/file?path=/nope", nil); st != 404 {
		t.Fatalf("a missing file: %d", st)
	}
	if st, _ := do(t, ts, "DELETE", "/volumecontent/vol1/path?path=/", nil); st != 400 {
		t.Fatalf("removing the root: %d", st)
	}
	if st, _ := do(t, ts, "DELETE", "/volumecontent/vol1/path?path=/data", nil); st != 204 {
		t.Fatalf("remove: %d", st)
	}
	if st, _ := do(t, ts, "GET", "/volumecontent/vol1/path?path=/data", nil); st != 404 {
		t.Fatalf("after remove: %d", st)
	}
	if st, _ := do(t, ts, "GET", "/volumecontent/nosuch/path?path=/", nil); st != 404 {
		t.Fatalf("an unknown volume: %d", st)
	}
	if st, _ := do(t, ts, "GET", "/volumecontent/vol1/dir?path=/&depth=99", nil); st != 400 {
		t.Fatalf("depth 99: %d", st)
	}
}

// TestArchiveExtract moves a volume between two volume directories, as
// between nodes: files, owners, modes, links and empty directories come
// across; an archive cannot write outside its volume.
func TestArchiveExtract(t *testing.T) {
	from, ts := newContent(t)
	do(t, ts, "PUT", "/volumecontent/vol1/file?path=/a/b.txt&force=true&mode=384", []byte("moved"))
	do(t, ts, "POST", "/volumecontent/vol1/dir?path=/empty&mode=320", nil)
	src, _ := from.Path("vol1")
	os.Symlink("a/b.txt", filepath.Join(src, "link"))
	var buf bytes.Buffer
	if n, err := from.Archive("vol1", &buf); err != nil || n != 5 {
		t.Fatalf("archive: %d %v", n, err)
	}
	to, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := to.Extract("vol1", bytes.NewReader(buf.Bytes()), 0); err != nil {
		t.Fatal(err)
	}
	dst, _ := to.Path("vol1")
	b, err := os.ReadFile(filepath.Join(dst, "link"))
	if err != nil || string(b) != "moved" {
		t.Fatalf("through the link: %q %v", b, err)
	}
	fi, _ := os.Stat(filepath.Join(dst, "a/b.txt"))
	if fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != DefaultUID {
		t.Fatalf("a/b.txt: mode %v uid %d", fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid)
	}
	if fi, err := os.Stat(filepath.Join(dst, "empty")); err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o500 {
		t.Fatalf("empty dir: %v %v", fi, err)
	}

	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	tw.WriteHeader(&tar.Header{Name: "escape", Typeflag: tar.TypeSymlink, Linkname: "/etc"})
	tw.WriteHeader(&tar.Header{Name: "escape/aenv-volume-escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1})
	tw.Write([]byte("x"))
	tw.Close()
	if err := to.Extract("vol2", &evil, 0); err == nil {
		t.Fatal("an archive wrote through a symlink out of its volume")
	}
	if _, err := os.Stat("/etc/aenv-volume-escape"); err == nil {
		os.Remove("/etc/aenv-volume-escape")
		t.Fatal("an archive wrote outside its volume")
	}
}
