package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestTemplateReachesNodeFromStore: a pure API server (no local node) and
// a node agent that joined it share a store. A template made on the API
// server's side is published there; a sandbox of it is placed on the node,
// which fetches the template and runs it; deleting the template removes it
// from the store.
func TestTemplateReachesNodeFromStore(t *testing.T) {
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
	api, err := Start(context.Background(), Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "api"), RunDir: filepath.Join(dir, "api-run"),
		NoLocalNode: true, StoreURL: shared, EtcdClientURLs: []string{etcdURL}, BaseRootFS: base,
		OnStop: cluster.StopKill, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close(context.Background())
	url := "http://" + api.Addr().String()
	token, err := os.ReadFile(ClusterTokenPath(filepath.Join(dir, "api")))
	if err != nil {
		t.Fatal(err)
	}
	n := tagCounter.Add(1)
	agent, err := StartNode(context.Background(), Config{
		Join: url, ClusterToken: strings.TrimSpace(string(token)), Listen: "127.0.0.1:0", NodeID: "storenode",
		DataDir: filepath.Join(dir, "node"), RunDir: filepath.Join(dir, "node-run"),
		RunscPath: runsc, EnvdPath: filepath.Join(binDir, "envd"), BaseRootFS: base,
		SandboxCIDR: fmt.Sprintf("10.23%d.0.0/16", 2+n%7), NetnsTag: "mnodet" + string(rune('a'+n%26)),
		NetnsPoolSize: 1, StoreURL: shared, OnStop: cluster.StopKill, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close(context.Background())
	c := client.New(url, api.APIKey())
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		nodes, err := c.Nodes(ctx)
		if err == nil && len(nodes) == 1 && nodes[0].State == "ready" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node did not join: %+v %v", nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The API server's side of the store gets a template (as a pull does).
	ts, err := template.NewStore(template.StoreOptions{Dir: filepath.Join(dir, "api", "templates"), Remote: api.remote, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ts.NewStage("tinyshared")
	if err != nil {
		t.Fatal(err)
	}
	root := st.RootFS()
	for _, d := range []string{"bin", "etc", "home/user", "tmp"} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	bb, err := os.ReadFile(busybox)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755))
	for _, applet := range []string{"sh", "cat", "echo"} {
		must(t, os.Symlink("busybox", filepath.Join(root, "bin", applet)))
	}
	must(t, os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "etc/marker"), []byte("from the store"), 0o644))
	must(t, os.Chown(filepath.Join(root, "home/user"), 1000, 1000))
	if err := st.Commit(&template.Template{ID: "tinyshared", CPUCount: 1, MemoryMB: 256,
		Image: &template.ImageConfig{Env: []string{"PATH=/bin"}}}); err != nil {
		t.Fatal(err)
	}

	listed, err := c.ListTemplates(ctx)
	if err != nil || !strings.Contains(fmt.Sprint(listed), "tinyshared") {
		t.Fatalf("templates listed by the API server: %+v %v", listed, err)
	}
	sb := mustCreate(t, c, client.CreateOptions{TemplateID: "tinyshared", Timeout: 60})
	if got := runOut(t, c, sb.SandboxID, "cat /etc/marker"); got != "from the store" {
		t.Fatalf("a file of the fetched template: %q", got)
	}
	if info, err := c.Get(ctx, sb.SandboxID); err != nil || info.NodeID != "storenode" {
		t.Fatalf("placed on %+v %v", info, err)
	}
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTemplate(ctx, "tinyshared"); err != nil {
		t.Fatal(err)
	}
	if _, err := api.remote.Get(ctx, "template-tinyshared"); err == nil {
		t.Fatal("the deleted template is still in the store")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
