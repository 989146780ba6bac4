package server

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
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

func runOut(t *testing.T, c *client.Client, id, cmd string) string {
	t.Helper()
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
	if n := sandboxProcs(id); n != 0 {
		t.Fatalf("%d host processes still run paused sandbox %s", n, id)
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
	for _, r := range results {
		if r.Sandbox == nil {
			t.Fatalf("a child failed: %+v", r.Error)
		}
		kids = append(kids, r.Sandbox.SandboxID)
		defer c.Kill(ctx, r.Sandbox.SandboxID)
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
