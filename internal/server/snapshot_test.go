package server

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/node"
)

// counterCmd starts a background process that counts in memory and writes
// the count to /tmp/counter: if a restore lost its memory, the count would
// start over.
const counterCmd = `nohup python3 -c '
import time
i = 0
while True:
    i += 1
    open("/tmp/counter.tmp", "w").write(str(i))
    __import__("os").rename("/tmp/counter.tmp", "/tmp/counter")
    time.sleep(0.05)
' >/dev/null 2>&1 &
sleep 0.5`

func runOut(t testing.TB, c *client.Client, id, cmd string) string {
	t.Helper()
	// Sandboxes made through raw requests (or before a restart) are not
	// known to c yet: looking one up gives c its envd token.
	c.Get(context.Background(), id)
	var out, errOut bytes.Buffer
	code, err := c.Run(context.Background(), id, cmd, client.RunOptions{Stdout: &out, Stderr: &errOut})
	if err != nil || code != 0 {
		t.Fatalf("running %q in %s: code %d err %v stderr %q", cmd, id, code, err, errOut.String())
	}
	return strings.TrimSpace(out.String())
}

func counter(t *testing.T, c *client.Client, id string) int {
	t.Helper()
	n, err := strconv.Atoi(runOut(t, c, id, "cat /tmp/counter"))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sandboxProcs counts host processes whose command line names the sandbox.
func sandboxProcs(id string) int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte(id)) {
			n++
		}
	}
	return n
}

// procsLeft waits up to within for sandbox id's host processes to leave
// and answers how many are left. A pause answers once the state is saved
// and a kill once the record is gone; what ran the sandbox is released in
// the background right after, later on a loaded host.
func procsLeft(id string, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		n := sandboxProcs(id)
		if n == 0 || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestPauseResume(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	defer c.Kill(ctx, id)
	runOut(t, c, id, "echo kept > /home/user/state.txt && "+counterCmd)
	before := counter(t, c, id)

	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/pause", ""); status != 204 {
		t.Fatalf("pause: %d %v", status, body)
	}
	released := time.Now().Add(10 * time.Second)
	if n := procsLeft(id, 10*time.Second); n != 0 {
		t.Fatalf("%d host processes still run paused sandbox %s", n, id)
	}
	for time.Now().Before(released) {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", srv.cfg.NetnsTag, id)); os.IsNotExist(err) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", srv.cfg.NetnsTag, id)); !os.IsNotExist(err) {
		t.Fatalf("paused sandbox still has a memory cgroup: %v", err)
	}
	got, err := c.Get(ctx, id)
	if err != nil || got.State != "paused" {
		t.Fatalf("get paused sandbox: %+v %v", got, err)
	}
	status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/pause", "")
	if status != 409 {
		t.Fatalf("second pause: %d %v, want 409", status, body)
	}
	req := `{"timeout": 60}`
	if status, body := rawRequest(t, srv, "POST", url+"/v2/sandboxes/"+id+"/connect", req); status != 201 {
		t.Fatalf("connect (resume): %d %v, want 201", status, body)
	}
	if status, body := rawRequest(t, srv, "POST", url+"/v2/sandboxes/"+id+"/connect", req); status != 200 {
		t.Fatalf("connect (running): %d %v, want 200", status, body)
	}
	if got := runOut(t, c, id, "cat /home/user/state.txt"); got != "kept" {
		t.Fatalf("file after resume: %q", got)
	}
	after := counter(t, c, id)
	time.Sleep(300 * time.Millisecond)
	later := counter(t, c, id)
	if after < before || later <= after {
		t.Fatalf("counter before pause %d, after resume %d, later %d: memory state lost or process stopped", before, after, later)
	}
}

func TestFork(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	parent := sb.SandboxID
	defer c.Kill(ctx, parent)
	runOut(t, c, parent, "echo parent > /tmp/who && "+counterCmd)
	base := counter(t, c, parent)

	status, _ := rawRequest(t, srv, "POST", url+"/sandboxes/"+parent+"/fork", `{"count": 101}`)
	if status != 400 {
		t.Fatalf("fork of 101: %d, want 400", status)
	}
	resp := postJSON(t, srv, url+"/sandboxes/"+parent+"/fork", `{"count": 4, "timeout": 60}`)
	var results []struct {
		Sandbox *client.Sandbox `json:"sandbox"`
		Error   *client.APIError
	}
	if err := json.Unmarshal(resp, &results); err != nil || len(results) != 4 {
		t.Fatalf("fork results %s: %v", resp, err)
	}
	var kids []string
	tokens := map[string]bool{sb.EnvdAccessToken: true}
	for _, r := range results {
		if r.Sandbox == nil {
			t.Fatalf("a child failed: %+v", r.Error)
		}
		kids = append(kids, r.Sandbox.SandboxID)
		defer c.Kill(ctx, r.Sandbox.SandboxID)
		// Each child has an envd token of its own: the parent's, or a
		// sibling's, opens nothing of it.
		if r.Sandbox.EnvdAccessToken == "" || tokens[r.Sandbox.EnvdAccessToken] {
			t.Fatalf("child %s has the token %q of its parent or a sibling", r.Sandbox.SandboxID, r.Sandbox.EnvdAccessToken)
		}
		tokens[r.Sandbox.EnvdAccessToken] = true
		for tok, want := range map[string]int{sb.EnvdAccessToken: 401, r.Sandbox.EnvdAccessToken: 200} {
			req, _ := http.NewRequest("GET", url+"/envs", nil)
			req.Header.Set("E2b-Sandbox-Id", r.Sandbox.SandboxID)
			req.Header.Set("E2b-Sandbox-Port", "49983")
			req.Header.Set("X-Access-Token", tok)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != want {
				t.Fatalf("child %s's envd with the %s token: %d, want %d", r.Sandbox.SandboxID, map[int]string{401: "parent's", 200: "child's"}[want], res.StatusCode, want)
			}
		}
	}
	for _, k := range kids {
		runOut(t, c, k, "echo "+k+" > /tmp/who")
	}
	for _, k := range kids {
		if got := runOut(t, c, k, "cat /tmp/who"); got != k {
			t.Errorf("child %s sees /tmp/who = %q", k, got)
		}
		if n := counter(t, c, k); n < base {
			t.Errorf("child %s counter %d < parent's %d at fork time: memory not inherited", k, n, base)
		}
	}
	if got := runOut(t, c, parent, "cat /tmp/who"); got != "parent" {
		t.Fatalf("parent sees /tmp/who = %q after children wrote theirs", got)
	}
	list, _ := c.List(ctx)
	if len(list) != 5 {
		t.Fatalf("%d sandboxes listed, want parent + 4 children", len(list))
	}
}

func postJSON(t *testing.T, srv *Server, url, body string) []byte {
	t.Helper()
	status, b := doRequest(t, srv, "POST", url, body)
	if status/100 != 2 {
		t.Fatalf("POST %s: %d %s", url, status, b)
	}
	return b
}

func TestSnapshotAsTemplate(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.SandboxID)
	runOut(t, c, sb.SandboxID, "echo from-snapshot > /home/user/marker")

	var snap struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
	}
	b := postJSON(t, srv, url+"/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"my-snap"}`)
	if err := json.Unmarshal(b, &snap); err != nil || snap.SnapshotID == "" || len(snap.Names) != 1 || snap.Names[0] != "my-snap" {
		t.Fatalf("snapshot response %s: %v", b, err)
	}
	// The source keeps running.
	runOut(t, c, sb.SandboxID, "true")
	if status, _ := rawRequest(t, srv, "POST", url+"/sandboxes/"+sb.SandboxID+"/snapshots", `{"name":"my-snap"}`); status != 409 {
		t.Fatalf("second snapshot with the same name: %d, want 409", status)
	}
	for _, ref := range []string{snap.SnapshotID, "my-snap"} {
		child, err := c.Create(ctx, client.CreateOptions{TemplateID: ref, Timeout: 60})
		if err != nil {
			t.Fatalf("create from %s: %v", ref, err)
		}
		if got := runOut(t, c, child.SandboxID, "cat /home/user/marker"); got != "from-snapshot" {
			t.Fatalf("sandbox from %s sees %q", ref, got)
		}
		c.Kill(ctx, child.SandboxID)
	}
	_, list := doRequest(t, srv, "GET", url+"/snapshots", "")
	if !strings.Contains(string(list), snap.SnapshotID) {
		t.Fatalf("GET /snapshots = %s, want %s in it", list, snap.SnapshotID)
	}
	if status, _ := doRequest(t, srv, "DELETE", url+"/templates/"+snap.SnapshotID, ""); status != 204 {
		t.Fatalf("delete snapshot: %d", status)
	}
	if _, err := c.Create(ctx, client.CreateOptions{TemplateID: "my-snap", Timeout: 60}); !isStatus(err, 404) {
		t.Fatalf("create from a deleted snapshot: %v, want 404", err)
	}
	if status, _ := doRequest(t, srv, "DELETE", url+"/templates/base", ""); status != 400 {
		t.Fatalf("deleting base: %d, want 400", status)
	}
}

func TestPausedSurvivesRestart(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 120, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	runOut(t, c, id, "echo survived > /home/user/f && "+counterCmd)
	before := counter(t, c, id)
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/pause", ""); status != 204 {
		t.Fatalf("pause: %d %v", status, body)
	}
	cfg := srv.cfg
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	srv2, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("restarting: %v", err)
	}
	defer srv2.Close(ctx)
	url2 := "http://" + srv2.Addr().String()
	c2 := client.New(url2, srv2.APIKey())
	got, err := c2.Get(ctx, id)
	if err != nil || got.State != "paused" || got.Metadata["k"] != "v" {
		t.Fatalf("after restart: %+v %v", got, err)
	}
	if status, body := rawRequest(t, srv2, "POST", url2+"/sandboxes/"+id+"/connect", `{"timeout":60}`); status != 201 {
		t.Fatalf("resume after restart: %d %v", status, body)
	}
	defer c2.Kill(ctx, id)
	if got := runOut(t, c2, id, "cat /home/user/f"); got != "survived" {
		t.Fatalf("file after restart+resume: %q", got)
	}
	if n := counter(t, c2, id); n < before {
		t.Fatalf("counter %d after resume < %d before pause", n, before)
	}
}

func TestAutoPauseOnTimeout(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	status, b := doRequest(t, srv, "POST", url+"/v2/sandboxes", `{"timeout": 2, "autoPause": true}`)
	if status != 201 {
		t.Fatalf("create: %d %s", status, b)
	}
	var sb client.Sandbox
	json.Unmarshal(b, &sb)
	defer c.Kill(ctx, sb.SandboxID)
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		got, err := c.Get(ctx, sb.SandboxID)
		if err != nil {
			t.Fatalf("autoPause sandbox vanished at its timeout: %v", err)
		}
		if got.State == "paused" {
			if n := procsLeft(sb.SandboxID, 10*time.Second); n != 0 {
				t.Fatalf("paused sandbox still has %d processes", n)
			}
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("sandbox with autoPause was not paused at its timeout")
}

// TestStoreRefusingWrites makes the snapshot store read-only: snapshot and
// pause fail with a clear error and the sandbox keeps running untouched.
func TestStoreRefusingWrites(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	defer c.Kill(ctx, id)
	runOut(t, c, id, counterCmd)

	dir := filepath.Join(srv.cfg.DataDir, "snapshots")
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dir, unix.MNT_DETACH)
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/sandboxes/" + id + "/snapshots", "/sandboxes/" + id + "/pause"} {
		status, body := rawRequest(t, srv, "POST", url+path, `{}`)
		msg, _ := body["message"].(string)
		if status != 500 || !strings.Contains(msg, "read-only file system") {
			t.Fatalf("POST %s on a read-only store: %d %v, want 500 naming the cause", path, status, body)
		}
		got, err := c.Get(ctx, id)
		if err != nil || got.State != "running" {
			t.Fatalf("after a failed %s: %+v %v", path, got, err)
		}
		a := counter(t, c, id)
		time.Sleep(200 * time.Millisecond)
		if b := counter(t, c, id); b <= a {
			t.Fatalf("sandbox stopped working after a failed %s", path)
		}
	}
}

// preparedOf is the local node's prepared sandboxes for restores of
// template id's sandboxes.
func preparedOf(srv *Server, id string) node.PoolStatus {
	for _, k := range srv.host.Node().WarmPool().Keys {
		if k.Key == (node.PoolKey{TemplateID: id, Restores: true}) {
			return k
		}
	}
	return node.PoolStatus{}
}

// TestResumeTakesPreparedSandbox: the first resume of a template's
// sandbox starts its own gVisor sandbox and teaches the warm pool to
// prepare one; the next resume loads its state into that one, runs on
// with its files and processes, outlives a restart of the server that
// keeps its sandboxes (its runtime name is the prepared one's), and
// leaves nothing in runsc once killed.
func TestResumeTakesPreparedSandbox(t *testing.T) {
	srv, c, url := startServerWith(t, func(cfg *Config) {
		cfg.WarmPoolFloor, cfg.OnStop = 0, cluster.StopKeep
	})
	cfg := srv.cfg
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 300})
	must(t, err)
	id := sb.SandboxID
	runOut(t, c, id, "echo kept > /home/user/state.txt && "+counterCmd)
	resume := func(srv *Server, url string) {
		t.Helper()
		if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/pause", ""); status != 204 {
			t.Fatalf("pause: %d %v", status, body)
		}
		if status, body := rawRequest(t, srv, "POST", url+"/v2/sandboxes/"+id+"/connect", `{"timeout": 300}`); status != 201 {
			t.Fatalf("resume: %d %v", status, body)
		}
	}
	resume(srv, url)
	if st := preparedOf(srv, "base"); st.Served.Cold != 1 || st.Served.Warm != 0 {
		t.Fatalf("after the first resume the prepared pool counts %+v, want 1 cold restore", st.Served)
	}
	deadline := time.Now().Add(time.Minute)
	for preparedOf(srv, "base").Ready < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no sandbox prepared after a resume: %+v", srv.host.Node().WarmPool())
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := counter(t, c, id)
	resume(srv, url)
	if st := preparedOf(srv, "base"); st.Served.Warm != 1 {
		t.Fatalf("the second resume took no prepared sandbox: %+v", st)
	}
	if got := runOut(t, c, id, "cat /home/user/state.txt"); got != "kept" {
		t.Fatalf("file after a resume into a prepared sandbox: %q", got)
	}
	if after := counter(t, c, id); after < before {
		t.Fatalf("counter %d after the resume < %d before: memory state lost", after, before)
	}
	if slices.Contains(runscSandboxes(t, cfg.RunDir), id) {
		t.Fatalf("runsc names the resumed sandbox %s: it did not go into a prepared one", id)
	}
	// The node's report reaches GET /nodes on its next heartbeat.
	deadline = time.Now().Add(20 * time.Second)
	for {
		nodes, err := c.Nodes(ctx)
		must(t, err)
		if slices.ContainsFunc(nodes[0].Pool, func(e client.PoolEntry) bool { return e.Prepared && e.TemplateID == "base" }) {
			prestarted := 0
			for _, e := range nodes[0].Pool {
				if !e.Prepared {
					prestarted += e.Ready
				}
			}
			if nodes[0].Pooled != prestarted {
				t.Errorf("GET /nodes counts %d pooled sandboxes, want the %d prestarted (not the prepared): %+v", nodes[0].Pooled, prestarted, nodes[0].Pool)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET /nodes shows no prepared pool of base: %+v", nodes[0].Pool)
		}
		time.Sleep(200 * time.Millisecond)
	}

	must(t, srv.Close(ctx))
	srv2, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("restarting: %v", err)
	}
	t.Cleanup(func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		srv2.cfg.OnStop = cluster.StopKill
		srv2.Close(cctx)
	})
	c2 := client.New("http://"+srv2.Addr().String(), srv2.APIKey())
	if got := runOut(t, c2, id, "cat /home/user/state.txt"); got != "kept" {
		t.Fatalf("file after the restart: %q", got)
	}
	must(t, c2.Kill(ctx, id))
	deadline = time.Now().Add(30 * time.Second)
	for {
		left := runscSandboxes(t, cfg.RunDir)
		// What is left is the new pool's (prepared or prestarted).
		pooled := 0
		for _, s := range srv2.host.Node().WarmPool().Keys {
			pooled += s.Ready
		}
		if len(left) <= pooled {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runsc runs %v after the kill, the pool holding %d", left, pooled)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
