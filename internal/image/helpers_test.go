package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

// busyboxPath is where Debian's busybox-static installs its binary.
const busyboxPath = "/bin/busybox"

// busybox returns a static busybox binary's content: the shell of every
// test image. It must be static, since test images have no libc.
func busybox(t testing.TB) []byte {
	t.Helper()
	f, err := elf.Open(busyboxPath)
	if err != nil {
		testutil.Unavailable(t, "busybox-static not installed (apt-get install -y busybox-static): "+err.Error())
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			testutil.Unavailable(t, busyboxPath+" is dynamically linked; install busybox-static")
		}
	}
	b, err := os.ReadFile(busyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// epoch is the modification time of every test entry.
var epoch = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// ent is one tar entry of a test layer.
type ent struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	link     string
	body     []byte
	major    int64
	minor    int64
	xattrs   map[string]string
}

func dir(name string) ent { return ent{name: name, typ: tar.TypeDir, mode: 0o755} }
func file(name, body string) ent {
	return ent{name: name, typ: tar.TypeReg, mode: 0o644, body: []byte(body)}
}
func symlink(name, target string) ent {
	return ent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}
func hardlink(name, target string) ent { return ent{name: name, typ: tar.TypeLink, link: target} }

// tarOf writes entries as an uncompressed tar.
func tarOf(t testing.TB, entries ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{
			Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Linkname: e.link, Size: int64(len(e.body)), ModTime: epoch,
			Devmajor: e.major, Devminor: e.minor, Format: tar.FormatPAX,
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[xattrPrefix+k] = v
		}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write(e.body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func gzipped(t testing.TB, b []byte, level int) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, level)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// layer makes a gzip-compressed layer of entries; opts can ask for
// another compression.
func layer(t testing.TB, entries []ent, opts ...tarball.LayerOption) v1.Layer {
	t.Helper()
	b := tarOf(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// plainLayer is an uncompressed layer.
func plainLayer(t testing.TB, entries ...ent) v1.Layer {
	t.Helper()
	return static.NewLayer(tarOf(t, entries...), types.OCIUncompressedLayer)
}

// shellLayer is a busybox tree: enough of an image for aenv. It is made
// (and compressed) once per run.
func shellLayer(t testing.TB) v1.Layer {
	t.Helper()
	bb := busybox(t)
	shellOnce.Do(func() {
		shell = layer(t, []ent{
			dir("bin/"),
			{name: "bin/busybox", typ: tar.TypeReg, mode: 0o755, body: bb},
			symlink("bin/sh", "busybox"),
			symlink("bin/ls", "busybox"),
			symlink("bin/cat", "busybox"),
		}, tarball.WithCompressedCaching)
	})
	return shell
}

var (
	shellOnce sync.Once
	shell     v1.Layer
)

// imageOf stacks layers into a linux/amd64 image with cfg.
func imageOf(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testRegistry is an in-process registry.
type testRegistry struct {
	srv  *httptest.Server
	host string
}

// newRegistry serves a registry; wrap, if set, sits in front of it.
func newRegistry(t testing.TB, wrap func(http.Handler) http.Handler) *testRegistry {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &testRegistry{srv: srv, host: strings.TrimPrefix(srv.URL, "http://")}
}

// push stores img as repo:tag and returns its reference.
func (r *testRegistry) push(t testing.TB, repo string, img v1.Image) string {
	t.Helper()
	ref := r.host + "/" + repo
	r2, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r2, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

// newStore makes an empty template store.
func newStore(t testing.TB) *template.Catalog {
	t.Helper()
	s, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(t.TempDir(), "templates")})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// treeOf lists a tree, one line per entry, sorted: path, type, mode,
// owner, and the link target, device or content digest.
func treeOf(t testing.TB, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		line := fmt.Sprintf("%s %s %04o %d:%d", rel, typeName(info.Mode()), st.Mode&0o7777, st.Uid, st.Gid)
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			line += " -> " + target
		case info.Mode()&fs.ModeDevice != 0:
			line += fmt.Sprintf(" %d,%d", st.Rdev>>8&0xfff, st.Rdev&0xff)
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if len(b) <= 80 && !bytes.ContainsRune(b, 0) {
				line += fmt.Sprintf(" %q", b)
			} else {
				sum := sha256.Sum256(b)
				line += " sha256:" + hex.EncodeToString(sum[:4])
			}
			if st.Nlink > 1 {
				line += fmt.Sprintf(" links=%d", st.Nlink)
			}
		}
		out = append(out, line)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

func typeName(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m&fs.ModeSymlink != 0:
		return "link"
	case m&fs.ModeCharDevice != 0:
		return "char"
	case m&fs.ModeDevice != 0:
		return "block"
	case m&fs.ModeNamedPipe != 0:
		return "fifo"
	default:
		return "file"
	}
}

// sha4 is how treeOf shows a larger file's content.
func sha4(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:4])
}

// assertTree compares a tree listing line by line.
func assertTree(t *testing.T, got, want []string) {
	t.Helper()
	sort.Strings(want)
	if strings.Join(got, "\n") == strings.Join(want, "\n") {
		return
	}
	gotSet := map[string]bool{}
	for _, g := range got {
		gotSet[g] = true
	}
	wantSet := map[string]bool{}
	for _, w := range want {
		wantSet[w] = true
		if !gotSet[w] {
			t.Errorf("missing: %s", w)
		}
	}
	for _, g := range got {
		if !wantSet[g] {
			t.Errorf("unexpected: %s", g)
		}
	}
}

// assertNoTemplate checks that a failed pull left nothing: no template
// and no stage directory.
func assertNoTemplate(t *testing.T, s *template.Catalog, id string) {
	t.Helper()
	if _, err := s.Get(id); err == nil {
		t.Errorf("template %s exists after a failed pull", id)
	}
	assertNoStages(t, s)
}

func assertNoStages(t *testing.T, s *template.Catalog) {
	t.Helper()
	entries, err := os.ReadDir(storeDir(s))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("left in the template directory: %s", e.Name())
		}
	}
}

// storeDir is the directory a store keeps its templates in.
func storeDir(s *template.Catalog) string {
	return filepath.Dir(filepath.Dir(s.BaseRootFS())) // <dir>/base/rootfs
}
