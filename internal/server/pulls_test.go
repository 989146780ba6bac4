package server

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/testutil"
)

// busyboxImage is a one-layer image: busybox, its shell, and /marker.
func busyboxImage(t *testing.T, busybox, marker string) v1.Image {
	t.Helper()
	bb, err := os.ReadFile(busybox)
	must(t, err)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body []byte) {
		h.Size = int64(len(body))
		must(t, tw.WriteHeader(h))
		tw.Write(body)
	}
	for _, d := range []string{"bin/", "etc/", "tmp/", "root/"} {
		add(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}, nil)
	}
	add(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, bb)
	for _, applet := range []string{"sh", "cat", "echo"} {
		add(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox"}, nil)
	}
	add(&tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	add(&tar.Header{Name: "etc/group", Typeflag: tar.TypeReg, Mode: 0o644}, []byte("root:x:0:\n"))
	add(&tar.Header{Name: "marker", Typeflag: tar.TypeReg, Mode: 0o644}, []byte(marker))
	must(t, tw.Close())
	layer, err := tarball.LayerFromReader(bytes.NewReader(buf.Bytes()))
	must(t, err)
	img, err := mutate.AppendLayers(empty.Image, layer)
	must(t, err)
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin"}})
	must(t, err)
	return img
}

// TestPullThroughPureAPIServer: a pure API server (no local node) hands
// pulls to the node agent that joined it: a registry's image and an
// uploaded docker archive become the caller's templates on the node,
// published to the store they share, with the pull's progress streamed
// back through the API server; sandboxes of them run on the node; a
// failed pull's error keeps its class, and leaves no template.
func TestPullThroughPureAPIServer(t *testing.T) {
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	busybox := testutil.RequireBinary(t, "busybox", "")
	base, binDir := os.Getenv("AENV_BASE_ROOTFS"), os.Getenv("AENV_BIN_DIR")
	if base == "" || binDir == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS and AENV_BIN_DIR must be set (make build base)")
	}
	dir := t.TempDir()
	shared := filepath.Join(dir, "shared-store")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	api, err := Start(context.Background(), Config{NoLocalNode: true, Config: agent.Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "api"), RunDir: filepath.Join(dir, "api-run"),
		StoreURL: shared, EtcdClientURLs: []string{etcdURL}, BaseRootFS: base,
		OnStop: cluster.StopKill, Logger: log,
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close(context.Background())
	url := "http://" + api.Addr().String()
	token, err := os.ReadFile(membership.ClusterTokenPath(filepath.Join(dir, "api")))
	must(t, err)
	n := tagCounter.Add(1)
	nodeAgent, err := agent.Start(context.Background(), agent.Config{
		Join: url, ClusterToken: strings.TrimSpace(string(token)), Listen: "127.0.0.1:0", NodeID: "pullnode",
		DataDir: filepath.Join(dir, "node"), RunDir: filepath.Join(dir, "node-run"),
		RunscPath: runsc, EnvdPath: filepath.Join(binDir, "envd"), BaseRootFS: base,
		SandboxCIDR: fmt.Sprintf("10.22%d.0.0/16", 2+n%7), NetnsTag: "pullt" + string(rune('a'+n%26)),
		NetnsPoolSize: 1, StoreURL: shared, OnStop: cluster.StopKill, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeAgent.Close(context.Background())
	c := client.New(url, api.APIKey())
	ctx := context.Background()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		nodes, err := c.Nodes(ctx)
		if err == nil && len(nodes) == 1 && nodes[0].State == "ready" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not join: %+v %v", nodes, err)
		}
	}

	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	ref := strings.TrimPrefix(reg.URL, "http://") + "/test/busybox:1"
	r, err := name.ParseReference(ref, name.Insecure)
	must(t, err)
	must(t, remote.Write(r, busyboxImage(t, busybox, "from the registry")))
	archive := filepath.Join(dir, "image.tar")
	tag, _ := name.NewTag("example.test/busybox:2")
	must(t, tarball.WriteToFile(archive, tag, busyboxImage(t, busybox, "from the archive")))

	var mu sync.Mutex
	var progress []client.PullProgress
	ev := client.ImportEvents{Progress: func(p client.PullProgress) { mu.Lock(); progress = append(progress, p); mu.Unlock() }}
	res, err := c.PullTemplate(ctx, client.PullSource{Ref: ref}, client.ImportOptions{Name: "pulled", CPUCount: 1, MemoryMB: 256}, ev)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if len(progress) == 0 || progress[len(progress)-1].ImageTotal == 0 || res.Layers != 1 || res.Digest == "" {
		t.Fatalf("the pull's result %+v after progress %+v", res, progress)
	}
	mu.Unlock()
	f, err := os.Open(archive)
	must(t, err)
	defer f.Close()
	if _, err := c.PullTemplate(ctx, client.PullSource{Format: "docker-archive", Body: f}, client.ImportOptions{Name: "archived"}, client.ImportEvents{}); err != nil {
		t.Fatal(err)
	}

	// The node made them (the API server made nothing), and published
	// them: the API server lists them from the store.
	if _, err := os.Stat(filepath.Join(dir, "node", "templates", res.TemplateID, "template.json")); err != nil {
		t.Fatalf("the pulled template is not on the node: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "api", "templates", res.TemplateID)); err == nil {
		t.Fatal("the pure API server unpacked the pull itself")
	}
	listed, err := c.ListTemplates(ctx)
	if err != nil || !strings.Contains(fmt.Sprint(listed), res.TemplateID) {
		t.Fatalf("templates the API server lists: %+v %v", listed, err)
	}
	for tpl, want := range map[string]string{"pulled": "from the registry", "archived": "from the archive"} {
		sb := mustCreate(t, c, client.CreateOptions{TemplateID: tpl, Timeout: 60})
		if got := runOut(t, c, sb.SandboxID, "cat /marker"); got != want {
			t.Fatalf("a sandbox of %s: marker %q", tpl, got)
		}
		if info, err := c.Get(ctx, sb.SandboxID); err != nil || info.NodeID != "pullnode" {
			t.Fatalf("placed on %+v %v", info, err)
		}
		must(t, c.Kill(ctx, sb.SandboxID))
	}

	// A missing image: its class (not found) reaches the client.
	_, err = c.PullTemplate(ctx, client.PullSource{Ref: strings.TrimPrefix(reg.URL, "http://") + "/test/missing:1"}, client.ImportOptions{Name: "never"}, client.ImportEvents{})
	var ie *client.ImportError
	if !errors.As(err, &ie) || ie.Status != 404 {
		t.Fatalf("pulling a missing image: %v, want a 404 import error", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "node", "templates", "never*")); len(left) > 0 {
		t.Fatalf("a failed pull left a template: %v", left)
	}
}
