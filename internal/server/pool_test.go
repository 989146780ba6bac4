package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/testutil"
)

// runscSandboxes lists the sandboxes runsc knows under a server's run
// directory.
func runscSandboxes(t *testing.T, runDir string) []string {
	t.Helper()
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	out, err := exec.Command(runsc, "--root", filepath.Join(runDir, "gvisor", "runsc"), "list", "-quiet").CombinedOutput()
	if err != nil {
		t.Fatalf("runsc list: %v: %s", err, out)
	}
	ids := strings.Fields(string(out))
	slices.Sort(ids)
	return ids
}

// poolOf is the local node's warm pool of template id.
func poolOf(srv *Server, id string) node.PoolStatus {
	for _, k := range srv.host.Node().WarmPool().Keys {
		if k.Key == (node.PoolKey{TemplateID: id}) {
			return k
		}
	}
	return node.PoolStatus{}
}

// burst creates n sandboxes of tpl at once and returns their ids and each
// create's time, sorted.
func burst(t *testing.T, c *client.Client, tpl string, n int) ([]string, []time.Duration) {
	t.Helper()
	var mu sync.Mutex
	var ids []string
	var took []time.Duration
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			sb, err := c.Create(context.Background(), client.CreateOptions{Timeout: 300, TemplateID: tpl})
			if err != nil {
				t.Errorf("a create of the burst: %v", err)
				return
			}
			mu.Lock()
			ids, took = append(ids, sb.SandboxID), append(took, time.Since(start))
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(took)
	return ids, took
}

// TestWarmPoolLearnsBursts: a template without a floor has no pool; a
// burst of creates sizes its pool to the burst, refilled in the
// background, and the next burst is served warm (the node's counts and
// /metrics say so). It logs both bursts' p50.
func TestWarmPoolLearnsBursts(t *testing.T) {
	const size = 8
	srv, c, url := startServerWith(t, func(cfg *Config) {
		cfg.WarmPoolFloor, cfg.WarmPoolMemory = 0, 1<<30
	})
	time.Sleep(2 * time.Second) // a tick or two: nothing is prestarted without demand
	if st := poolOf(srv, "base"); st.Ready != 0 {
		t.Fatalf("without a floor or demand the pool holds %d", st.Ready)
	}
	first, cold := burst(t, c, "base", size)
	if st := poolOf(srv, "base"); st.Served.Cold != size || st.Peak != size {
		t.Errorf("after the first burst: %+v, want %d cold creates and a peak of %d", st, size, size)
	}
	for _, id := range first {
		if err := c.Kill(context.Background(), id); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(3 * time.Minute)
	for poolOf(srv, "base").Ready < size {
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not grow to the burst: %+v", poolOf(srv, "base"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	second, warm := burst(t, c, "base", size)
	if st := poolOf(srv, "base"); st.Served.Warm != size {
		t.Errorf("after the second burst: %+v, want %d creates served warm", st, size)
	}
	t.Logf("burst of %d: cold p50 %v (max %v), then warm p50 %v (max %v)", size,
		cold[size/2].Round(time.Millisecond), cold[size-1].Round(time.Millisecond),
		warm[size/2].Round(time.Millisecond), warm[size-1].Round(time.Millisecond))
	for _, id := range second {
		if out := runOut(t, c, id, "echo ok"); out != "ok" {
			t.Errorf("a sandbox served warm runs %q", out)
		}
	}

	req, err := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	must(t, err)
	req.Header.Set("X-API-Key", srv.APIKey())
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		fmt.Sprintf(`aenv_warm_pool_creates_total{snapshot="",template="base",warm="true"} %d`, size),
		fmt.Sprintf(`aenv_warm_pool_creates_total{snapshot="",template="base",warm="false"} %d`, size),
		`aenv_warm_pool_target{snapshot="",template="base"} `,
		`aenv_warm_pool_sandboxes{snapshot="",template="base"}`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	nodes, err := c.Nodes(context.Background())
	// Both bursts may fall within 10 s: the pool is sized to one burst
	// at least.
	if err != nil || len(nodes) != 1 || len(nodes[0].Pool) == 0 || nodes[0].Pool[0].TemplateID != "base" || nodes[0].Pool[0].Target < size {
		t.Errorf("GET /nodes: %+v, %v; want the node's pool of base, sized %d or more", nodes, err, size)
	}
}

// TestStopKeepKillsThePool: a server stopped keeping its sandboxes keeps
// the users' only: its prestarted ones are killed, a lazily served
// template's among them, and with no kept sandbox on a block image its
// image server stops.
func TestStopKeepKillsThePool(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs", "")
	storeDir := filepath.Join(t.TempDir(), "store")
	publishBaseCopy(t, storeDir, "lazybase")
	srv, c, _ := startServerWith(t, func(cfg *Config) {
		cfg.OnStop, cfg.StoreURL, cfg.WarmPoolFloor = cluster.StopKeep, storeDir, 1
	})
	cfg := srv.cfg.Config
	t.Cleanup(func() {
		// What the stopped server kept must not outlive the test: a
		// cleanup that failed part-way is tried again.
		var err error
		for range 3 {
			if err = agent.Cleanup(context.Background(), cfg); err == nil {
				return
			}
		}
		t.Errorf("cleaning up: %v", err)
	})
	ctx := context.Background()
	user, err := c.Create(ctx, client.CreateOptions{Timeout: 300})
	must(t, err)
	lazy, err := c.Create(ctx, client.CreateOptions{Timeout: 300, TemplateID: "lazybase"})
	must(t, err)
	must(t, c.Kill(ctx, lazy.SandboxID))
	deadline := time.Now().Add(2 * time.Minute)
	for poolOf(srv, "lazybase").Ready < 1 || poolOf(srv, "base").Ready < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no prestarted sandbox of each template: %+v", srv.host.Node().WarmPool())
		}
		time.Sleep(100 * time.Millisecond)
	}
	images := srv.host.ImageServer()
	if images == nil {
		t.Fatal("the server runs no image server")
	}
	if _, err := images.Info(ctx); err != nil {
		t.Fatalf("the image server before the stop: %v", err)
	}
	if got := srv.host.Node().RootImages(); len(got) == 0 {
		t.Fatal("no sandbox runs on a block image before the stop (the prestarted lazybase should)")
	}

	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	must(t, srv.Close(sctx))
	if n := sandboxProcs(user.SandboxID); n == 0 {
		t.Error("the stop killed the user's sandbox")
	}
	if got := runscSandboxes(t, cfg.RunDir); !slices.Equal(got, []string{user.SandboxID}) {
		t.Errorf("runsc runs %v after the stop, want the user's %s only", got, user.SandboxID)
	}
	if _, err := images.Info(ctx); err == nil {
		t.Error("the image server still answers after the stop, with no kept sandbox on its images")
	}
}

// TestWarmPoolSnapshot: a user snapshot used as a template gets a pool
// once created from: the next create from it is served warm, restored
// with the snapshot's files and memory, and bound to its own access
// token, not its sibling's.
func TestWarmPoolSnapshot(t *testing.T) {
	srv, c, _ := startServerWith(t, func(cfg *Config) { cfg.WarmPoolFloor = 0 })
	ctx := context.Background()
	src, err := c.Create(ctx, client.CreateOptions{Timeout: 300})
	must(t, err)
	runOut(t, c, src.SandboxID, "echo saved > /home/user/f")
	snap, err := c.Snapshot(ctx, src.SandboxID, "warmsnap")
	must(t, err)
	must(t, c.Kill(ctx, src.SandboxID))
	key := node.PoolKey{SnapshotID: snap.SnapshotID}
	status := func() node.PoolStatus {
		for _, k := range srv.host.Node().WarmPool().Keys {
			if k.Key == key {
				return k
			}
		}
		return node.PoolStatus{}
	}
	cold, err := c.Create(ctx, client.CreateOptions{Timeout: 300, TemplateID: "warmsnap"})
	must(t, err)
	if st := status(); st.Served.Cold != 1 || st.Served.Warm != 0 {
		t.Fatalf("after the first create from the snapshot: %+v", st)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for status().Ready < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no sandbox of the snapshot prestarted: %+v", srv.host.Node().WarmPool())
		}
		time.Sleep(100 * time.Millisecond)
	}
	warm, err := c.Create(ctx, client.CreateOptions{Timeout: 300, TemplateID: "warmsnap"})
	must(t, err)
	if st := status(); st.Served.Warm != 1 {
		t.Errorf("the second create from the snapshot: %+v, want it served warm", st)
	}
	if f := runOut(t, c, warm.SandboxID, "cat /home/user/f"); f != "saved" {
		t.Errorf("the warm sandbox's file: %q", f)
	}
	if warm.EnvdAccessToken == "" || warm.EnvdAccessToken == cold.EnvdAccessToken {
		t.Errorf("the warm sandbox's token %q, its sibling's %q: want one of its own", warm.EnvdAccessToken, cold.EnvdAccessToken)
	}
	must(t, c.DeleteSnapshot(ctx, "warmsnap"))
	if st := status(); st.Ready != 0 {
		t.Errorf("a deleted snapshot keeps %d prestarted", st.Ready)
	}
}

// TestPrestartedSandboxShellReady: a prestarted base sandbox runs no
// command before it is taken, yet waits with a login shell ready (envd's,
// as the SDKs' commands run), which its user's first command takes; the
// log its user sees of it starts at the create.
func TestPrestartedSandboxShellReady(t *testing.T) {
	srv, c, _ := startServer(t)
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for poolOf(srv, "base").Ready < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no prestarted base sandbox: %+v", srv.host.Node().WarmPool())
		}
		time.Sleep(100 * time.Millisecond)
	}
	envdLog := func(id string) string {
		b, _ := os.ReadFile(filepath.Join(srv.cfg.RunDir, "gvisor", "sandboxes", id, "envd.log"))
		return string(b)
	}
	// The prestarted sandboxes' envd logs, as the runtime keeps them
	// (the node shows no log of a sandbox not handed out).
	var pooled []string
	for _, id := range runscSandboxes(t, srv.cfg.RunDir) {
		log := envdLog(id)
		if log == "" {
			continue // a prepared sandbox, whose envd has not started
		}
		// The pool warms each one's first command (warmFirstCommand):
		// one `true` as the SDKs run it, and nothing else. One without it
		// yet is still being prestarted.
		switch strings.Count(log, `msg="process started"`) {
		case 0:
			continue
		case 1:
			if !strings.Contains(log, `args="-l -c true" user=user`) {
				t.Fatalf("prestarted sandbox %s ran another command than the pool's `true`; its envd log:\n%s", id, log)
			}
		default:
			t.Fatalf("prestarted sandbox %s ran more than the pool's `true` before it was taken; its envd log:\n%s", id, log)
		}
		pooled = append(pooled, id)
	}
	if len(pooled) == 0 {
		t.Fatal("no prestarted sandbox with an envd log")
	}

	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 300})
	must(t, err)
	defer c.Kill(ctx, sb.SandboxID)
	if !slices.Contains(pooled, sb.SandboxID) {
		t.Fatalf("sandbox %s was not one of the prestarted %v", sb.SandboxID, pooled)
	}
	if out := runOut(t, c, sb.SandboxID, "echo mine"); out != "mine" {
		t.Fatalf("the first command printed %q", out)
	}
	if log := envdLog(sb.SandboxID); !strings.Contains(log, `args="-l -c echo mine" user=user pty=false ready_shell=true`) {
		t.Errorf("the first command did not take the ready shell; envd's log:\n%s", log)
	}
	entries, err := srv.host.Node().Logs(sb.SandboxID)
	must(t, err)
	var started []string
	for _, e := range entries {
		if e.Message == "process started" || e.Message == "initialized" {
			started = append(started, e.Message+" "+e.Fields["args"])
		}
	}
	if !slices.Equal(started, []string{"process started -l -c echo mine"}) {
		t.Fatalf("the user's log of sandbox %s: %+v; want its own command only", sb.SandboxID, entries)
	}
}
