package cli

import (
	"archive/tar"
	"bytes"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/aenvhq/aenv/internal/testutil"
)

// busyboxImage is a one-layer image: busybox as /bin/busybox and /bin/sh,
// and a marker file naming the image.
func busyboxImage(t *testing.T, marker string) v1.Image {
	t.Helper()
	bb, err := os.ReadFile(testutil.RequireBinary(t, "busybox", ""))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	for _, d := range []string{"bin/", "etc/", "tmp/", "root/"} {
		add(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	}
	add(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, bb)
	for _, applet := range []string{"sh", "cat", "echo", "whoami"} {
		add(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox"}, nil)
	}
	add(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	add(&tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:\n"))
	add(&tar.Header{Name: "marker", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(marker+"\n"))
	tw.Close()
	layer, err := tarball.LayerFromReader(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin"}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestPull pulls images through the CLI from an in-process registry, an OCI
// layout and a docker-archive tarball, and runs commands in sandboxes made
// from them; bad references fail with one clear line.
func TestPull(t *testing.T) {
	e := startServer(t)
	dataDir := filepath.Join(shared.dir, "data")
	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")

	img := busyboxImage(t, "from-registry")
	ref, err := name.ParseReference(host+"/test/busybox:1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lp, err := layout.Write(filepath.Join(dir, "layout"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(busyboxImage(t, "from-layout")); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "image.tar")
	tag, _ := name.NewTag("example.test/busybox:2")
	if err := tarball.WriteToFile(archive, tag, busyboxImage(t, "from-archive")); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ ref, name, want string }{
		{host + "/test/busybox:1", "pulled-registry", "from-registry"},
		{"oci:" + filepath.Join(dir, "layout"), "pulled-layout", "from-layout"},
		{"docker-archive:" + archive, "pulled-archive", "from-archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := e.mustRun(t, "pull", tc.ref, "--name", tc.name, "--data-dir", dataDir)
			if !strings.Contains(out, tc.name) {
				t.Fatalf("pull printed %q, want the template id", out)
			}
			id := e.create(t, tc.name)
			// The E2B way of running commands (bash -l -c) works in a
			// busybox image too.
			got := strings.TrimSpace(e.mustRun(t, "exec", id, "--", "cat /marker; whoami"))
			if got != tc.want+"\nuser" {
				t.Fatalf("sandbox from %s printed %q", tc.ref, got)
			}
		})
	}

	for _, bad := range []string{host + "/test/missing:1", "127.0.0.1:1/x/y:1", "oci:" + filepath.Join(dir, "nope"), "Bad Ref!!"} {
		r := e.run(t, "", "pull", bad, "--name", "never", "--data-dir", dataDir)
		if r.code == 0 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.HasPrefix(r.stderr, "aenv: ") {
			t.Errorf("pull %q: exit %d, stderr %q: want one error line and a non-zero exit", bad, r.code, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dataDir, "templates", "never")); !os.IsNotExist(err) {
		t.Fatalf("a failed pull left a template: %v", err)
	}
}
