package server

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/template/erofs"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestTemplateReachesNodeFromStore: a pure API server (no local node) and
// a node agent that joined it share a store. A template made on the API
// server's side is published there; a sandbox of it is placed on the node,
// which serves it from its block image, fetched on demand (one mount for
// eight sandboxes; a new version leaves running sandboxes their files; a
// restarted node with a warm cache fetches nothing); deleting the template
// removes it from the store.
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
	if err != nil {
		t.Fatal(err)
	}
	n := tagCounter.Add(1)
	nodeCfg := agent.Config{
		Join: url, ClusterToken: strings.TrimSpace(string(token)), Listen: "127.0.0.1:0", NodeID: "storenode",
		DataDir: filepath.Join(dir, "node"), RunDir: filepath.Join(dir, "node-run"),
		RunscPath: runsc, EnvdPath: filepath.Join(binDir, "envd"), BaseRootFS: base,
		SandboxCIDR: fmt.Sprintf("10.23%d.0.0/16", 2+n%7), NetnsTag: "mnodet" + string(rune('a'+n%26)),
		NetnsPoolSize: 1, StoreURL: shared, OnStop: cluster.StopKill, Logger: log,
		// No warm pool: the burst of creates below would teach it
		// tinyshared, and its pooled sandbox would hold the image too.
		WarmPoolMemory: -1,
	}
	nodeAgent, err := agent.Start(context.Background(), nodeCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { nodeAgent.Close(context.Background()) }()
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
	ts, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(dir, "api", "templates"), Remote: api.remote, Images: api.images, Blocks: erofs.Images{}, Logger: log})
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
	// A file no sandbox reads until the template has a new version.
	unread := make([]byte, 16<<20)
	rand.Read(unread)
	must(t, os.WriteFile(filepath.Join(root, "etc/unread"), unread, 0o644))
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
	// The node serves the template from its block image, fetched on
	// demand: one mount, read in part.
	info, err := nodeAgent.Host().ImageServer().Info(ctx)
	must(t, err)
	if len(info.Images) != 1 || info.Images[0].File != "" || info.Images[0].Eager {
		t.Fatalf("images the node serves: %+v", info.Images)
	}
	img := info.Images[0]
	if img.FetchedBytes == 0 || img.FetchedBytes >= img.Size/2 {
		t.Fatalf("the node fetched %d bytes of a %d-byte image to start a sandbox: not on demand", img.FetchedBytes, img.Size)
	}
	t.Logf("first sandbox: %d of %d image bytes fetched", img.FetchedBytes, img.Size)
	// Eight sandboxes of the template on the node: one mount.
	sbs := []*client.Sandbox{sb}
	for range 7 {
		sbs = append(sbs, mustCreate(t, c, client.CreateOptions{TemplateID: "tinyshared", Timeout: 120}))
	}
	if n := mountCount(t, filepath.Join(dir, "node-run", "images"), "erofs"); n != 1 {
		t.Fatalf("%d erofs mounts for 8 sandboxes of one template, want 1", n)
	}
	if info, _ = nodeAgent.Host().ImageServer().Info(ctx); len(info.Images) != 1 || len(info.Images[0].Holders) != 8 {
		t.Fatalf("images the node serves to 8 sandboxes: %+v", info.Images)
	}
	clusterFigures(t, c, sb.SandboxID)
	// A volume at a path the read-only image lacks: its mount point is
	// added over the image for that sandbox alone.
	if _, err := c.CreateVolume(ctx, "lazyvol", client.VolumeOptions{}); err != nil {
		t.Fatal(err)
	}
	withVol := mustCreate(t, c, client.CreateOptions{TemplateID: "tinyshared", Timeout: 60,
		VolumeMounts: []client.VolumeMount{{Name: "lazyvol", Path: "/mnt/new/vol"}}})
	if got := runOut(t, c, withVol.SandboxID, "echo kept > /mnt/new/vol/f && cat /mnt/new/vol/f /etc/marker"); got != "kept\nfrom the store" {
		t.Fatalf("a volume at a new path in a lazy template's sandbox: %q", got)
	}
	must(t, c.Kill(ctx, withVol.SandboxID))
	if n := mountCount(t, filepath.Join(dir, "node-run"), "overlay"); n != 0 {
		t.Fatalf("%d overlays left after the sandbox with a volume ended", n)
	}
	metrics := nodeMetrics(t, nodeAgent, string(token))
	if !strings.Contains(metrics, `aenv_image_fetched_bytes_total{template="tinyshared"}`) || !strings.Contains(metrics, "aenv_image_cache_bytes") {
		t.Fatalf("the node's /metrics lack the image figures:\n%s", metrics)
	}

	// A new version replaces the template: a sandbox started before keeps
	// its files, even those it never read; a new one gets the new files.
	v1, err := ts.GetLocal("tinyshared")
	must(t, err)
	st, err = ts.NewStage("tinyshared")
	must(t, err)
	must(t, exec.Command("cp", "-a", v1.RootFS+"/.", st.RootFS()+"/").Run())
	must(t, os.WriteFile(filepath.Join(st.RootFS(), "etc/marker"), []byte("version 2"), 0o644))
	must(t, os.Remove(filepath.Join(st.RootFS(), "etc/unread")))
	must(t, st.Commit(&template.Template{ID: "tinyshared", CPUCount: 1, MemoryMB: 256,
		Image: &template.ImageConfig{Env: []string{"PATH=/bin"}}}))
	if got := runOut(t, c, sb.SandboxID, "cat /etc/marker"); got != "from the store" {
		t.Fatalf("a sandbox of the first version, after the second: marker %q", got)
	}
	if got := runOut(t, c, sb.SandboxID, "cat /etc/unread | wc -c"); got != "16777216" {
		t.Fatalf("a sandbox of the first version reading a file it had not read: %q bytes", got)
	}
	v2 := mustCreate(t, c, client.CreateOptions{TemplateID: "tinyshared", Timeout: 60})
	if got := runOut(t, c, v2.SandboxID, "cat /etc/marker"); got != "version 2" {
		t.Fatalf("a sandbox of the second version: marker %q", got)
	}
	sbs = append(sbs, v2)
	for _, s := range sbs {
		must(t, c.Kill(ctx, s.SandboxID))
	}

	// The node restarts (its image server too): with its cache warm it
	// fetches nothing for the template it had.
	must(t, nodeAgent.Close(ctx))
	if n := mountCount(t, filepath.Join(dir, "node-run", "images"), "erofs"); n != 0 {
		t.Fatalf("%d image mounts left after the node stopped with its sandboxes", n)
	}
	nodeAgent, err = agent.Start(ctx, nodeCfg)
	must(t, err)
	waitNodeReady(t, c)
	sb = mustCreate(t, c, client.CreateOptions{TemplateID: "tinyshared", Timeout: 60})
	if got := runOut(t, c, sb.SandboxID, "cat /etc/marker"); got != "version 2" {
		t.Fatalf("after the node restarted: marker %q", got)
	}
	info, err = nodeAgent.Host().ImageServer().Info(ctx)
	must(t, err)
	if len(info.Images) != 1 || info.Images[0].FetchedBytes != 0 || info.Images[0].Hits == 0 {
		t.Fatalf("a node restarted with a warm cache fetched from the store: %+v", info.Images)
	}
	// The store keeps the images something uses: the current version's;
	// the replaced one goes. Once the template is deleted (the API
	// refuses while a sandbox runs on it), its image goes too.
	v2tpl, err := ts.GetLocal("tinyshared")
	must(t, err)
	must(t, collectGarbage(ctx, api.remote, api.cluster, 0, log))
	if _, err := api.remote.Get(ctx, v2tpl.BlockImage); err != nil {
		t.Fatalf("the store's GC deleted the image of a template's current version: %v", err)
	}
	if _, err := api.remote.Get(ctx, v1.BlockImage); err == nil {
		t.Fatal("the store's GC kept an image nothing uses")
	}
	if got := runOut(t, c, sb.SandboxID, "cat /etc/marker /etc/passwd | wc -l"); got != "2" {
		t.Fatalf("a sandbox after the store's GC: %q", got)
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
	deadline = time.Now().Add(30 * time.Second)
	for {
		must(t, collectGarbage(ctx, api.remote, api.cluster, 0, log))
		if _, err := api.remote.Get(ctx, v2tpl.BlockImage); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the image of a deleted template outlived its last sandbox")
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// mountCount counts the mounts of type fstype under dir.
func mountCount(t testing.TB, dir, fstype string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mounts")
	must(t, err)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && strings.HasPrefix(f[1], dir+"/") && f[2] == fstype {
			n++
		}
	}
	return n
}

// clusterFigures: the node's heartbeat carries its image cache to the
// registry, which the API server (no node of its own) answers GET /nodes
// and /metrics with, beside running sandbox id's last sample, which it
// asks the node for at the scrape.
func clusterFigures(t *testing.T, c *client.Client, id string) {
	t.Helper()
	ctx := context.Background()
	// A report since the eight sandboxes started: their vCPUs in it.
	var cache *client.ImageCache
	cpus := 0
	for deadline := time.Now().Add(15 * time.Second); cache == nil || cache.Mounted != 1 || cpus < 8; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the node's record has image cache %+v and %d vCPUs committed after 15 s, want its one image mounted and 8", cache, cpus)
		}
		nodes, err := c.Nodes(ctx)
		must(t, err)
		for _, n := range nodes {
			if n.ID == "storenode" {
				cache, cpus = n.ImageCache, n.Usage.CPUCount
			}
		}
	}
	if cache.MaxBytes <= 0 || cache.Bytes <= 0 || cache.Bytes > cache.MaxBytes || cache.Misses <= 0 {
		t.Fatalf("the node's image cache as GET /nodes has it: %+v; want chunks held within a bound, and the misses that fetched them", cache)
	}
	t.Logf("the node's image cache as its record has it: %+v", *cache)
	m, err := c.Metrics(ctx)
	must(t, err)
	for series, ok := range map[string]bool{
		`aenv_node_image_cache_bytes{node="storenode"}`: m[`aenv_node_image_cache_bytes{node="storenode"}`] > 0,
		`aenv_node_images_mounted{node="storenode"}`:    m[`aenv_node_images_mounted{node="storenode"}`] == 1,
		`aenv_node_cpus_committed{node="storenode"}`:    m[`aenv_node_cpus_committed{node="storenode"}`] >= 8,
		"aenv_sandbox_memory_used_bytes of " + id:       m[`aenv_sandbox_memory_used_bytes{node="storenode",sandbox_id="`+id+`",template="tinyshared"}`] > 0,
		"aenv_sandbox_memory_limit_bytes of " + id:      m[`aenv_sandbox_memory_limit_bytes{node="storenode",sandbox_id="`+id+`",template="tinyshared"}`] == 256<<20,
	} {
		if !ok {
			var have []string
			for k := range m {
				if strings.HasPrefix(k, "aenv_node_") || strings.HasPrefix(k, "aenv_sandbox_") {
					have = append(have, k)
				}
			}
			t.Errorf("the API server's /metrics: %s is missing or wrong; it has %v", series, have)
		}
	}
}

// nodeMetrics reads a node agent's /metrics with the cluster token.
func nodeMetrics(t *testing.T, a *agent.Agent, token string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+a.Addr().String()+"/metrics", nil)
	req.Header.Set(nodeapi.TokenHeader, strings.TrimSpace(token))
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("node /metrics: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// waitNodeReady waits for the cluster's one node to be ready.
func waitNodeReady(t *testing.T, c *client.Client) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		nodes, err := c.Nodes(context.Background())
		if err == nil && len(nodes) == 1 && nodes[0].State == "ready" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node is not ready: %+v %v", nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
