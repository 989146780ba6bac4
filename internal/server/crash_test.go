package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/testutil"
)

// serverProc is `aenv server` run as its own process, so that a test can
// kill -9 it.
type serverProc struct {
	cmd      *exec.Cmd
	url, key string
}

func startServerProc(t *testing.T, dataDir, runDir string) *serverProc {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	logf, err := os.OpenFile(filepath.Join(filepath.Dir(dataDir), "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(os.Getenv("AENV_BIN_DIR"), "aenv"), "server",
		"--listen", addr, "--data-dir", dataDir, "--run-dir", runDir,
		"--base-rootfs", os.Getenv("AENV_BASE_ROOTFS"), "--netns-tag", "crasht",
		"--sandbox-cidr", "10.238.0.0/16", "--warm-pool", "0", "--log-level", "debug")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProc{cmd: cmd, url: "http://" + addr}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(p.url + "/health"); err == nil {
			resp.Body.Close()
			b, _ := os.ReadFile(filepath.Join(dataDir, "secrets", "api-key"))
			p.key = strings.TrimSpace(string(b))
			return p
		}
		time.Sleep(100 * time.Millisecond)
	}
	cmd.Process.Kill()
	t.Fatalf("server did not come up; see %s", logf.Name())
	return nil
}

// TestKill9MidPause kills the server with SIGKILL while it writes a
// pause snapshot: after a restart no partial snapshot is visible or left
// on disk, and an earlier snapshot of the sandbox still starts sandboxes.
func TestKill9MidPause(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	if os.Getenv("AENV_BIN_DIR") == "" || os.Getenv("AENV_BASE_ROOTFS") == "" {
		testutil.Unavailable(t, "AENV_BIN_DIR and AENV_BASE_ROOTFS must be set (make build base)")
	}
	dir := t.TempDir()
	dataDir, runDir := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	p := startServerProc(t, dataDir, runDir)
	ctx := context.Background()
	c := client.New(p.url, p.key)
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 300, MemoryMB: 1024})
	if err != nil {
		p.cmd.Process.Kill()
		t.Fatal(err)
	}
	runOut(t, c, sb.SandboxID, "echo precious > /home/user/f")
	if _, err := snapshotVia(p, sb.SandboxID, "before-crash"); err != nil {
		p.cmd.Process.Kill()
		t.Fatal(err)
	}
	// Enough dirty memory that the pause takes a while to write.
	runOut(t, c, sb.SandboxID, `nohup python3 -c "b = bytearray(300 << 20); import time; time.sleep(3600)" >/dev/null 2>&1 & sleep 2`)

	go func() {
		req, _ := http.NewRequest("POST", p.url+"/sandboxes/"+sb.SandboxID+"/pause", nil)
		req.Header.Set("X-API-Key", p.key)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	snapDir := filepath.Join(dataDir, "snapshots")
	deadline := time.Now().Add(20 * time.Second)
	for {
		partial, _ := filepath.Glob(filepath.Join(snapDir, "*.partial"))
		if len(partial) > 0 {
			break
		}
		if time.Now().After(deadline) {
			p.cmd.Process.Kill()
			t.Fatal("the pause never started writing its snapshot")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.cmd.Wait()

	p2 := startServerProc(t, dataDir, runDir)
	defer func() {
		p2.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p2.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			p2.cmd.Process.Kill()
			t.Error("restarted server did not stop on SIGTERM")
		}
	}()
	if partial, _ := filepath.Glob(filepath.Join(snapDir, "*.partial")); len(partial) != 0 {
		t.Fatalf("partial snapshots left after restart: %v", partial)
	}
	c2 := client.New(p2.url, p2.key)
	child, err := c2.Create(ctx, client.CreateOptions{TemplateID: "before-crash", Timeout: 60})
	if err != nil {
		t.Fatalf("the earlier snapshot no longer starts sandboxes: %v", err)
	}
	if got := runOut(t, c2, child.SandboxID, "cat /home/user/f"); got != "precious" {
		t.Fatalf("sandbox from the earlier snapshot sees %q", got)
	}
	c2.Kill(ctx, child.SandboxID)
	// The crashed server's sandboxes were cleaned up at restart.
	list, err := c2.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range list {
		if s.State == "running" {
			t.Fatalf("a sandbox of the crashed server is listed as running: %+v", s)
		}
	}
	if n := sandboxProcs(sb.SandboxID); n != 0 {
		t.Fatalf("%d processes of the crashed server's sandbox survived the restart", n)
	}
}

func snapshotVia(p *serverProc, id, name string) (string, error) {
	req, _ := http.NewRequest("POST", p.url+"/sandboxes/"+id+"/snapshots", strings.NewReader(`{"name":"`+name+`"}`))
	req.Header.Set("X-API-Key", p.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 201 {
		return "", fmt.Errorf("snapshot: %s", resp.Status)
	}
	return name, nil
}
