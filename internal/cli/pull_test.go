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

// TestPull pulls images through the CLI and the server's API from an
// in-process registry, an OCI layout and a docker-archive tarball (those
// two uploaded), and runs commands in sandboxes made from them; bad
// references fail with one clear line.
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
			// Only --url and --key: local images are uploaded.
			out := e.mustRun(t, "pull", tc.ref, "--name", tc.name)
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
		r := e.run(t, "", "pull", bad, "--name", "never")
		if r.code == 0 || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.HasPrefix(r.stderr, "aenv: ") {
			t.Errorf("pull %q: exit %d, stderr %q: want one error line and a non-zero exit", bad, r.code, r.stderr)
		}
	}
	if left, _ := filepath.Glob(filepath.Join(dataDir, "templates", "never*")); len(left) > 0 {
		t.Fatalf("a failed pull left a template: %v", left)
	}
}

// TestBuild builds templates through the API from a client that knows
// only the server's URL and key: the context is uploaded, the log comes
// back, a failing RUN step's exit code is the CLI's and leaves nothing.
func TestBuild(t *testing.T) {
	e := startServer(t)
	dir := t.TempDir()
	ctxDir := filepath.Join(dir, "ctx")
	os.MkdirAll(filepath.Join(ctxDir, "sub"), 0o755)
	os.WriteFile(filepath.Join(ctxDir, "sub", "hello.txt"), []byte("hello from the context\n"), 0o644)
	os.WriteFile(filepath.Join(ctxDir, "Dockerfile"), []byte(
		"FROM base\nARG GREETING=hi\nCOPY sub/hello.txt /opt/hello.txt\nRUN echo \"built $GREETING\" | tee /opt/built\n"), 0o644)
	r := e.run(t, "", "build", filepath.Join(ctxDir, "Dockerfile"), "--name", "built-ctx", "--build-arg", "GREETING=yo")
	if r.code != 0 {
		t.Fatalf("build: exit %d, stderr %q", r.code, r.stderr)
	}
	// The id is the name qualified by the key's team.
	if !strings.HasPrefix(strings.TrimSpace(r.stdout), "built-ctx.") || !strings.Contains(r.stderr, "built yo") {
		t.Fatalf("build printed %q, log %q", r.stdout, r.stderr)
	}
	id := e.create(t, "built-ctx")
	if got := strings.TrimSpace(e.mustRun(t, "exec", id, "--", "cat /opt/hello.txt /opt/built")); got != "hello from the context\nbuilt yo" {
		t.Fatalf("sandbox of the built template sees %q", got)
	}

	// A Dockerfile outside its context, whose RUN fails with code 3.
	df := filepath.Join(dir, "Failing.Dockerfile")
	os.WriteFile(df, []byte("FROM base\nRUN exit 3\n"), 0o644)
	r = e.run(t, "", "build", df, "--context", ctxDir, "--name", "never-built")
	if r.code != 3 {
		t.Fatalf("failing build: exit %d, want 3; stderr %q", r.code, r.stderr)
	}
	list := e.mustRun(t, "template", "ls")
	if strings.Contains(list, "never-built") {
		t.Fatalf("a failed build left a template:\n%s", list)
	}
	if !strings.Contains(list, "built-ctx") || !strings.Contains(list, "MiB") {
		t.Fatalf("template ls does not show the built template with its size:\n%s", list)
	}
	if !strings.Contains(list, "block images: ") || !strings.Contains(list, "deduplicated") {
		t.Fatalf("template ls does not sum the block images:\n%s", list)
	}
	// A Dockerfile the server cannot parse is a clear error, before any work.
	os.WriteFile(df, []byte("FROM base\nADD x /x\n"), 0o644)
	if r = e.run(t, "", "build", df, "--name", "never-built"); r.code == 0 || !strings.Contains(r.stderr, "ADD") {
		t.Fatalf("unsupported instruction: exit %d, stderr %q", r.code, r.stderr)
	}
}
