package server

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/node"
)

// TestInitTakeover: nobody but the node configures envd. Through the proxy
// without a key, and from inside the sandbox as uid 1000 (on loopback and
// on its own address), POST /init is refused, even with the sandbox's own
// access token, because the caller is not the node; and the sandbox's
// owner keeps using it as before.
func TestInitTakeover(t *testing.T) {
	_, c, url := startServer(t)
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 120})

	req, _ := http.NewRequest("POST", url+"/init", strings.NewReader(`{"accessToken":"x","defaultUser":"root"}`))
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("/init through the proxy without a key: %d, want 403", resp.StatusCode)
	}

	if sb.EnvdAccessToken == "" {
		t.Fatal("the sandbox has no envd access token")
	}
	// From inside, without the token the token check refuses (401); with
	// it, which a process inside may well know, /init is still refused,
	// since the caller is not the node (403).
	for _, addr := range []string{"127.0.0.1", "169.254.0.21"} {
		for _, try := range []struct{ token, want string }{{"", "401"}, {sb.EnvdAccessToken, "403"}} {
			got := runOut(t, c, sb.SandboxID, `python3 -c '
import urllib.request, urllib.error
r = urllib.request.Request("http://`+addr+`:49983/init", data=b"{\"accessToken\":\"x\",\"defaultUser\":\"root\"}", method="POST")
if "`+try.token+`":
    r.add_header("X-Access-Token", "`+try.token+`")
try:
    print(urllib.request.urlopen(r).status)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
'`)
			code, body, _ := strings.Cut(got, " ")
			if code != try.want || try.want == "403" && !strings.Contains(body, "not for callers inside the sandbox") {
				t.Fatalf("/init from inside the sandbox via %s (token given: %v) answered %s, want %s", addr, try.token != "", got, try.want)
			}
		}
	}
	if who := runOut(t, c, sb.SandboxID, "id -u"); who != "1000" {
		t.Fatalf("after the attempts commands run as uid %s, want 1000 with the sandbox's own token", who)
	}
}

// TestAdmission: a sandbox larger than the node is refused with 400; one
// that does not fit the node's overcommitted memory now gets 503 with
// Retry-After and the reason, and fits again once another one is gone.
func TestAdmission(t *testing.T) {
	_, c, _ := startServerWith(t, func(cfg *Config) {
		cfg.WarmPoolMemory = -1
		cfg.Capacity = node.Capacity{MemoryMB: 2048, CPUCount: 2, MemoryOvercommit: 1}
	})
	ctx := context.Background()
	for _, big := range []client.CreateOptions{{MemoryMB: 4096}, {CPUCount: 4}} {
		big.Timeout = 60
		if _, err := c.Create(ctx, big); !isStatus(err, 400) {
			t.Fatalf("create %+v on a 2 GiB, 2-CPU node: %v, want 400", big, err)
		}
	}
	a, err := c.Create(ctx, client.CreateOptions{Timeout: 60, MemoryMB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	mustCreate(t, c, client.CreateOptions{Timeout: 60, MemoryMB: 1024})
	_, err = c.Create(ctx, client.CreateOptions{Timeout: 60, MemoryMB: 512})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 503 || !strings.Contains(apiErr.Message, "commit") {
		t.Fatalf("create on a full node: %v, want 503 saying why", err)
	}
	if err := c.Kill(ctx, a.SandboxID); err != nil {
		t.Fatal(err)
	}
	d, err := c.Create(ctx, client.CreateOptions{Timeout: 60, MemoryMB: 512})
	if err != nil {
		t.Fatalf("create after a sandbox left: %v", err)
	}
	c.Kill(ctx, d.SandboxID)
}

// TestForkBombContained: a fork bomb as the sandbox's user stays inside
// its pids limit (fork fails with EAGAIN), the sandbox stays alive, and
// another sandbox keeps answering meanwhile.
func TestForkBombContained(t *testing.T) {
	_, c, _ := startServerWith(t, func(cfg *Config) {
		cfg.WarmPoolMemory = -1
		cfg.PidsLimit = 64
	})
	ctx := context.Background()
	bomb := mustCreate(t, c, client.CreateOptions{Timeout: 120})
	other := mustCreate(t, c, client.CreateOptions{Timeout: 120})

	// The classic bomb, as the sandbox's user, left running.
	runOut(t, c, bomb.SandboxID, `nohup bash -c ':(){ :|:& };:' >/dev/null 2>&1 &`)
	time.Sleep(3 * time.Second)
	if got := runOut(t, c, other.SandboxID, "echo alive"); got != "alive" {
		t.Fatalf("the other sandbox during the bomb: %q", got)
	}
	// Root inside is not bound by the limit: it counts and ends the bomb.
	asRoot := func(script string) string {
		t.Helper()
		var out, errOut strings.Builder
		code, err := c.Run(ctx, bomb.SandboxID, "python3 -c '"+script+"'", client.RunOptions{User: "root", Stdout: &out, Stderr: &errOut})
		if err != nil || code != 0 {
			t.Fatalf("as root in the bombed sandbox: code %d, %v, %s", code, err, errOut.String())
		}
		return strings.TrimSpace(out.String())
	}
	const userProcs = `
import os
def procs():
    out = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and os.stat("/proc/" + p).st_uid == 1000:
                out.append(int(p))
        except OSError:
            pass
    return out
`
	n, _ := strconv.Atoi(asRoot(userProcs + "print(len(procs()))"))
	if n == 0 || n > 64+8 {
		t.Fatalf("%d processes of the user during the bomb, want some and at most the limit of 64", n)
	}
	asRoot(userProcs + `
import signal, time
for _ in range(50):
    ps = procs()
    if not ps:
        break
    for p in ps:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.1)
`)
	// Past the bomb, the sandbox itself is alive and works.
	deadline := time.Now().Add(15 * time.Second)
	for {
		var o strings.Builder
		code, err := c.Run(ctx, bomb.SandboxID, "echo survived", client.RunOptions{Stdout: &o})
		if err == nil && code == 0 && strings.TrimSpace(o.String()) == "survived" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the bombed sandbox does not work after the bomb: code %d, %v, %q", code, err, o.String())
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestOutOfMemorySaidPlainly: a sandbox that goes past its memory is
// ended, and for a day its id answers 404 saying it ran out of memory and
// how much it had.
func TestOutOfMemorySaidPlainly(t *testing.T) {
	_, c, _ := startServerWith(t, func(cfg *Config) { cfg.WarmPoolMemory = -1 })
	ctx := context.Background()
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 120, MemoryMB: 256})
	// The command dies with the sandbox, and its stream says why.
	_, err := c.Run(ctx, sb.SandboxID, `python3 -c "b = bytearray(700 << 20); import time; time.sleep(60)"`, client.RunOptions{})
	if err == nil || !strings.Contains(err.Error(), "killed: out of memory (memoryMB=256)") {
		t.Fatalf("the command of a sandbox that ran out of memory ended with %v, want an error saying so", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		_, err := c.Get(ctx, sb.SandboxID)
		if isStatus(err, 404) {
			if !strings.Contains(err.Error(), "killed: out of memory (memoryMB=256)") {
				t.Fatalf("404 for the sandbox that ran out of memory says %q", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox is still there 15s after going past its memory: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestTokensByDefault: every sandbox gets an envd access token unless the
// server allows insecure sandboxes and the client asks for none; without
// it envd refuses.
func TestTokensByDefault(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 60})
	if sb.EnvdAccessToken == "" {
		t.Fatal("a sandbox created without secure has no envd access token")
	}
	if _, err := client.New(url, srv.APIKey()).Run(ctx, sb.SandboxID, "true", client.RunOptions{}); err == nil {
		t.Fatal("envd ran a command without the sandbox's token")
	}

	_, c2, _ := startServerWith(t, func(cfg *Config) { cfg.AllowInsecureSandboxes = true })
	open := mustCreate(t, c2, client.CreateOptions{Timeout: 60})
	if open.EnvdAccessToken != "" {
		t.Fatal("--allow-insecure-sandboxes still gave a token to a sandbox that asked for none")
	}
}

// mustCreate creates a sandbox that is killed when the test ends.
func mustCreate(t testing.TB, c *client.Client, opts client.CreateOptions) *client.Sandbox {
	t.Helper()
	sb, err := c.Create(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.SandboxID) })
	return sb
}

// TestKeysAndQuotas: an admin key makes keys; a key with a sandbox quota
// gets 429 past it, and again room once one of its sandboxes ends; a
// plain key cannot manage keys or nodes; a revoked key is refused.
func TestKeysAndQuotas(t *testing.T) {
	srv, admin, _ := startServerWith(t, func(cfg *Config) { cfg.WarmPoolMemory = -1 })
	ctx := context.Background()
	url := "http://" + srv.Addr().String()
	k, err := admin.CreateKey(ctx, "trainer", client.KeyOptions{MaxSandboxes: 1})
	if err != nil {
		t.Fatal(err)
	}
	user := client.New(url, k.Key)
	a := mustCreate(t, user, client.CreateOptions{Timeout: 60})
	_, err = user.Create(ctx, client.CreateOptions{Timeout: 60})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 429 || !strings.Contains(apiErr.Message, "1 of its 1 sandboxes") {
		t.Fatalf("a create past the key's quota: %v, want 429 saying so", err)
	}
	// The admin key has no quota.
	b := mustCreate(t, admin, client.CreateOptions{Timeout: 60})
	if err := user.Kill(ctx, a.SandboxID); err != nil {
		t.Fatal(err)
	}
	c := mustCreate(t, user, client.CreateOptions{Timeout: 60})
	for _, id := range []string{b.SandboxID, c.SandboxID} {
		admin.Kill(ctx, id)
	}
	if _, err := user.Keys(ctx); !isStatus(err, 403) {
		t.Fatalf("listing keys with a plain key: %v, want 403", err)
	}
	if _, err := user.Drain(ctx, "any", true); !isStatus(err, 403) {
		t.Fatalf("draining with a plain key: %v, want 403", err)
	}
	keys, err := admin.Keys(ctx)
	if err != nil || len(keys) != 2 {
		t.Fatalf("keys: %+v, %v", keys, err)
	}
	if err := admin.RevokeKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := user.List(ctx); !isStatus(err, 401) {
		t.Fatalf("a revoked key: %v, want 401", err)
	}
}

// TestDiskFull: a sandbox's files go to a disk of its own size: df inside
// shows it, a write past it fails with ENOSPC for the writer, the sandbox
// and its memory are untouched, and pause and resume keep the files.
func TestDiskFull(t *testing.T) {
	_, c, _ := startServerWith(t, func(cfg *Config) { cfg.WarmPoolMemory = -1; cfg.DiskMB = 1024 })
	ctx := context.Background()
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 300, MemoryMB: 512})
	if out := runOut(t, c, sb.SandboxID, "df -m / | tail -1 | awk '{print $2}'"); out != "1024" {
		t.Fatalf("df inside: %q MiB, want 1024", out)
	}
	var stderr bytes.Buffer
	code, err := c.Run(ctx, sb.SandboxID, "dd if=/dev/zero of=/home/user/big bs=1M count=2048", client.RunOptions{Stderr: &stderr})
	if err != nil {
		t.Fatalf("writing 2 GiB onto a 1 GiB disk: %v (the sandbox should live)", err)
	}
	if code == 0 || !strings.Contains(stderr.String(), "No space left on device") {
		t.Fatalf("dd past the disk: exit %d, stderr %q; want ENOSPC", code, stderr.String())
	}
	if out := runOut(t, c, sb.SandboxID, "echo alive; rm /home/user/big; echo kept > /home/user/kept.txt"); !strings.Contains(out, "alive") {
		t.Fatalf("after a full disk: %q", out)
	}
	if err := c.Pause(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Connect(ctx, sb.SandboxID, 300*time.Second); err != nil {
		t.Fatal(err)
	}
	if out := runOut(t, c, sb.SandboxID, "cat /home/user/kept.txt; df -m / | tail -1 | awk '{print $2}'"); out != "kept\n1024" {
		t.Fatalf("after pause and resume: %q", out)
	}
}
