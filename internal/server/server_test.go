package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/testutil"
)

var tagCounter atomic.Int32

// startServer runs a real server (gVisor, netns, envd) for one test.
func startServer(t testing.TB) (*Server, *client.Client, string) {
	t.Helper()
	return startServerWith(t, nil)
}

// startServerWith is startServer with a chance to adjust the config.
func startServerWith(t testing.TB, adjust func(*Config)) (*Server, *client.Client, string) {
	t.Helper()
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	base := os.Getenv("AENV_BASE_ROOTFS")
	if base == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS not set (make base builds it)")
	}
	binDir := os.Getenv("AENV_BIN_DIR")
	if binDir == "" {
		testutil.Unavailable(t, "AENV_BIN_DIR not set (make build puts envd there)")
	}
	dir := t.TempDir()
	n := tagCounter.Add(1)
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	cfg := Config{Config: agent.Config{
		Listen:     "127.0.0.1:0",
		DataDir:    filepath.Join(dir, "data"),
		RunDir:     filepath.Join(dir, "run"),
		RunscPath:  runsc,
		EnvdPath:   filepath.Join(binDir, "envd"),
		BaseRootFS: base,
		// 10.232-10.238 are this package's alone among the Go tests
		// (two packages run at once): a range two servers share makes
		// sandboxes unreachable, which netns now refuses at start.
		SandboxCIDR:   fmt.Sprintf("10.23%d.0.0/16", 2+n%7),
		NetnsTag:      "srvt" + string(rune('a'+n%26)),
		NetnsPoolSize: 2,
		WarmPoolFloor: 2,
		// Room for a few prestarted sandboxes past the floor, not for
		// every burst a test makes: the suite shares two cores.
		WarmPoolMemory: 256 << 20,
		// Sandboxes must not outlive the test.
		OnStop: cluster.StopKill,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}}
	if adjust != nil {
		adjust(&cfg)
	}
	srv, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("starting server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("closing server: %v", err)
		}
	})
	url := "http://" + srv.Addr().String()
	return srv, client.New(url, srv.APIKey()), url
}

func TestCreateRunKill(t *testing.T) {
	_, c, _ := startServer(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 60, EnvVars: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	code, err := c.Run(ctx, sb.SandboxID, "echo $GREETING $(whoami); exit 3", client.RunOptions{Stdout: &out})
	if err != nil {
		t.Fatal(err)
	}
	if code != 3 || strings.TrimSpace(out.String()) != "hi user" {
		t.Fatalf("got code %d output %q, want 3 and %q", code, out.String(), "hi user")
	}
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, sb.SandboxID); !isStatus(err, 404) {
		t.Fatalf("get after kill: got %v, want 404", err)
	}
}

func isStatus(err error, status int) bool {
	ae, ok := err.(interface{ Unwrap() error })
	for ok {
		err = ae.Unwrap()
		ae, ok = err.(interface{ Unwrap() error })
	}
	apiErr, isAPI := err.(*client.APIError)
	return isAPI && apiErr.Status == status
}

func TestTimeoutKillsSandbox(t *testing.T) {
	_, c, _ := startServer(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 1})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := c.Get(ctx, sb.SandboxID); isStatus(err, 404) {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("sandbox %s still exists 10s after its 1s timeout", sb.SandboxID)
}

// doRequest sends a request with the API key and returns status and body.
func doRequest(t *testing.T, srv *Server, method, url, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("X-API-Key", srv.APIKey())
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// rawRequest is doRequest with the body decoded as {code, message}.
func rawRequest(t *testing.T, srv *Server, method, url, body string) (int, map[string]any) {
	t.Helper()
	status, b := doRequest(t, srv, method, url, body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return status, m
}

func TestBadInputLeavesNothing(t *testing.T) {
	srv, c, url := startServer(t)
	sandboxDirs := func() int {
		entries, _ := os.ReadDir(filepath.Join(srv.cfg.RunDir, "gvisor", "sandboxes"))
		return len(entries)
	}
	// A sandbox of the key's own, for bodies that are refused only once
	// the sandbox is known (an unknown one is 404 first, as another
	// team's is).
	own := mustCreate(t, c, client.CreateOptions{Timeout: 120})
	// Prestarted sandboxes have state dirs too; wait for the pool to fill.
	time.Sleep(2 * time.Second)
	dirsBefore := sandboxDirs()
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"malformed json", "POST", "/v2/sandboxes", `{"templateID":`, 400},
		{"wrong type", "POST", "/v2/sandboxes", `{"timeout":"soon"}`, 400},
		{"unknown template", "POST", "/v2/sandboxes", `{"templateID":"nope"}`, 404},
		{"template traversal", "POST", "/v2/sandboxes", `{"templateID":"../../etc"}`, 400},
		{"negative timeout", "POST", "/v2/sandboxes", `{"timeout":-1}`, 400},
		{"huge timeout", "POST", "/v2/sandboxes", `{"timeout":1000000000}`, 400},
		{"huge memory", "POST", "/v2/sandboxes", `{"memoryMB":100000000}`, 400},
		{"oversized body", "POST", "/v2/sandboxes", `{"metadata":{"a":"` + strings.Repeat("x", 2<<20) + `"}}`, 413},
		{"traversal id get", "GET", "/sandboxes/..%2F..%2Fetc", "", 400},
		{"traversal id delete", "DELETE", "/sandboxes/abc%2F..", "", 400},
		{"upper-case id", "GET", "/sandboxes/ABC", "", 400},
		{"unknown id", "GET", "/sandboxes/abc123", "", 404},
		{"unknown id kill", "DELETE", "/sandboxes/abc123", "", 404},
		{"bad timeout body", "POST", "/sandboxes/" + own.SandboxID + "/timeout", `{"timeout":0}`, 400},
		{"bad body of an unknown id", "POST", "/sandboxes/abc123/timeout", `{"timeout":0}`, 404},
		{"bad list limit", "GET", "/v2/sandboxes?limit=1000", "", 400},
		{"bad list state", "GET", "/v2/sandboxes?state=dead", "", 400},
		{"bad next token", "GET", "/v2/sandboxes?nextToken=%%%", "", 400},
		{"fork timeout overflowing", "POST", "/sandboxes/" + own.SandboxID + "/fork", `{"count":1,"timeout":36028797018964068}`, 400},
		{"huge env var", "POST", "/v2/sandboxes", `{"envVars":{"X":"` + strings.Repeat("x", 900<<10) + `"}}`, 400},
		{"huge metadata value", "POST", "/v2/sandboxes", `{"metadata":{"k":"` + strings.Repeat("x", 900<<10) + `"}}`, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := rawRequest(t, srv, tc.method, url+tc.path, tc.body)
			if status != tc.want {
				t.Fatalf("status %d, want %d (body %v)", status, tc.want, body)
			}
			if code, _ := body["code"].(float64); int(code) != tc.want || body["message"] == "" {
				t.Fatalf("body %v is not {code:%d, message}", body, tc.want)
			}
		})
	}
	list, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].SandboxID != own.SandboxID {
		t.Fatalf("bad requests left %d sandboxes besides the test's own behind", len(list)-1)
	}
	if n := sandboxDirs(); n != dirsBefore {
		t.Fatalf("bad requests changed the sandbox dirs from %d to %d", dirsBefore, n)
	}
}

func TestWrongKey(t *testing.T) {
	_, _, url := startServer(t)
	c := client.New(url, "e2b_0000")
	if _, err := c.List(context.Background()); !isStatus(err, 401) {
		t.Fatalf("got %v, want 401", err)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	var ids []string
	for i := range 3 {
		sb, err := c.Create(ctx, client.CreateOptions{Timeout: 60, Metadata: map[string]string{"n": fmt.Sprint(i), "group": "g"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.SandboxID)
		t.Cleanup(func() { c.Kill(context.Background(), sb.SandboxID) })
	}
	status, _ := rawRequest(t, srv, "GET", url+"/v2/sandboxes?metadata=n%3D1", "")
	if status != 200 {
		t.Fatal(status)
	}
	var seen []string
	next := ""
	for page := 0; page < 5; page++ {
		req, _ := http.NewRequest("GET", url+"/v2/sandboxes?metadata=group%3Dg&limit=2&nextToken="+next, nil)
		req.Header.Set("X-API-Key", srv.APIKey())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got []client.Sandbox
		json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		for _, sb := range got {
			seen = append(seen, sb.SandboxID)
		}
		next = resp.Header.Get("X-Next-Token")
		if next == "" {
			break
		}
	}
	if strings.Join(seen, ",") != strings.Join(ids, ",") {
		t.Fatalf("paged list %v, want %v in creation order", seen, ids)
	}
	req, _ := http.NewRequest("GET", url+"/v2/sandboxes?metadata=n%3D1", nil)
	req.Header.Set("X-API-Key", srv.APIKey())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var got []client.Sandbox
	json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if len(got) != 1 || got[0].SandboxID != ids[1] {
		t.Fatalf("metadata filter n=1 returned %v, want only %s", got, ids[1])
	}
}

// hostCounts are the host resources a sandbox holds while it runs.
type hostCounts struct {
	procs, mounts, netns, cgroups, links, stateDirs int
}

func countHost(t *testing.T, srv *Server) hostCounts {
	t.Helper()
	// Only what belongs to this server counts: other servers and tests may
	// run on the same host at the same time.
	var c hostCounts
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if bytes.Contains(b, []byte(srv.cfg.RunDir)) {
			c.procs++
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mi), "\n") {
		if strings.Contains(line, srv.cfg.RunDir) {
			c.mounts++
		}
	}
	ns, _ := os.ReadDir(filepath.Join(srv.cfg.RunDir, "netns"))
	c.netns = len(ns)
	for _, ctl := range []string{"memory", "cpu", "pids"} {
		cg, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctl, srv.cfg.NetnsTag))
		for _, e := range cg {
			if e.IsDir() {
				c.cgroups++
			}
		}
	}
	ifs, _ := net.Interfaces()
	for _, i := range ifs {
		if strings.HasPrefix(i.Name, srv.cfg.NetnsTag) {
			c.links++
		}
	}
	sd, _ := os.ReadDir(filepath.Join(srv.cfg.RunDir, "gvisor", "sandboxes"))
	c.stateDirs = len(sd)
	return c
}

func TestKillLeavesNothingBehind(t *testing.T) {
	// The pool at its floor whatever the demand: what it holds is in the
	// baseline.
	srv, c, _ := startServerWith(t, func(cfg *Config) { cfg.WarmPoolMax = cfg.WarmPoolFloor })
	ctx := context.Background()
	// One cycle first, so that one-off set-up (runsc's shared state, the
	// netns pool refill) is in the baseline.
	cycle := func() {
		sb, err := c.Create(ctx, client.CreateOptions{Timeout: 60})
		if err != nil {
			t.Fatal(err)
		}
		if code, err := c.Run(ctx, sb.SandboxID, "true", client.RunOptions{}); err != nil || code != 0 {
			t.Fatalf("run: %d %v", code, err)
		}
		if err := c.Kill(ctx, sb.SandboxID); err != nil {
			t.Fatal(err)
		}
	}
	cycle()
	awaitPoolFull(t, srv)
	before := stableCounts(t, srv)
	for range 50 {
		cycle()
	}
	// The netns and warm pools refill in the background; give them time.
	var after hostCounts
	deadline := time.Now().Add(10 * time.Second)
	for {
		awaitPoolFull(t, srv)
		if after = countHost(t, srv); after == before {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("50 create/kill cycles leaked: before %+v, after %+v", before, after)
}

// awaitPoolFull waits until each key of srv's warm pool holds its target.
// The pool boots only while the host is idle, which other tests beside
// this one can put off for seconds: counts read before it filled would
// take its refill for a leak.
func awaitPoolFull(t *testing.T, srv *Server) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		full := true
		for _, k := range srv.host.Node().WarmPool().Keys {
			full = full && k.Ready >= k.Target
		}
		if full {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool never filled: %+v", srv.host.Node().WarmPool())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stableCounts waits until background work (pool refills) has settled and
// returns the host counts then.
func stableCounts(t *testing.T, srv *Server) hostCounts {
	prev := countHost(t, srv)
	for range 50 {
		time.Sleep(300 * time.Millisecond)
		cur := countHost(t, srv)
		if cur == prev {
			return cur
		}
		prev = cur
	}
	t.Fatalf("host counts never settled: %+v", prev)
	return prev
}
