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
	log      string
	started  time.Time
	ready    time.Duration // from the process start to the first /health
	waitc    chan struct{} // closed when the process has exited
}

// kill9 kills the server with SIGKILL and waits for it to be gone.
func (p *serverProc) kill9() {
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.waitc
}

// stop sends SIGTERM and waits up to limit for the server to exit,
// killing it (and failing t) after that.
func (p *serverProc) stop(t testing.TB, limit time.Duration) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.waitc:
	case <-time.After(limit):
		p.kill9()
		t.Errorf("server did not stop within %s of SIGTERM; log %s", limit, p.log)
	}
}

func startServerProc(t testing.TB, dataDir, runDir string, extra ...string) *serverProc {
	t.Helper()
	if os.Getenv("AENV_BIN_DIR") == "" || os.Getenv("AENV_BASE_ROOTFS") == "" {
		testutil.Unavailable(t, "AENV_BIN_DIR and AENV_BASE_ROOTFS must be set (make build base)")
	}
	p, err := launchServerProc(dataDir, runDir, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// launchServerProc is startServerProc for any goroutine: it reports what
// went wrong instead of failing a test.
func launchServerProc(dataDir, runDir string, extra ...string) (*serverProc, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	logPath := filepath.Join(filepath.Dir(dataDir), "server.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	args := append([]string{"server",
		"--listen", addr, "--data-dir", dataDir, "--run-dir", runDir,
		"--base-rootfs", os.Getenv("AENV_BASE_ROOTFS"), "--netns-tag", "crasht",
		"--sandbox-cidr", "10.238.0.0/16", "--warm-pool-memory", "0", "--log-level", "debug"}, extra...)
	cmd := exec.Command(filepath.Join(os.Getenv("AENV_BIN_DIR"), "aenv"), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	p := &serverProc{cmd: cmd, url: "http://" + addr, log: logPath, started: started, waitc: exited}
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(p.url + "/health"); err == nil {
			resp.Body.Close()
			p.ready = time.Since(started)
			b, _ := os.ReadFile(filepath.Join(dataDir, "secrets", "api-key"))
			p.key = strings.TrimSpace(string(b))
			p.waitc = exited
			return p, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("server exited during start-up; log %s:\n%s", logPath, tail(logPath))
		case <-time.After(100 * time.Millisecond):
		}
	}
	p.kill9()
	return nil, fmt.Errorf("server did not come up; log %s:\n%s", logPath, tail(logPath))
}

// tail returns the end of a log file, for failure messages.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// TestKill9MidPause kills the server with SIGKILL while it writes a
// pause snapshot: after a restart no partial snapshot is visible or left
// on disk, and an earlier snapshot of the sandbox still starts sandboxes.
func TestKill9MidPause(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	dir := t.TempDir()
	dataDir, runDir := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	p := startServerProc(t, dataDir, runDir)
	ctx := context.Background()
	c := client.New(p.url, p.key)
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 300, MemoryMB: 1024})
	if err != nil {
		p.kill9()
		t.Fatal(err)
	}
	runOut(t, c, sb.SandboxID, "echo precious > /home/user/f")
	if _, err := snapshotVia(p, sb.SandboxID, "before-crash"); err != nil {
		p.kill9()
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
			p.kill9()
			t.Fatal("the pause never started writing its snapshot")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	p.kill9()

	p2 := startServerProc(t, dataDir, runDir, "--on-stop", "kill")
	defer p2.stop(t, 60*time.Second)
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
	// The pause was cut short. A pause freezes the sandbox and ends it
	// only once its state is committed, so the restart finds it frozen or
	// running, thaws it, and it runs on with its files.
	got, err := c2.Get(ctx, sb.SandboxID)
	if err != nil || got.State != "running" {
		t.Fatalf("after a kill -9 mid-pause the sandbox is %+v, %v; want it running", got, err)
	}
	if f := runOut(t, c2, sb.SandboxID, "cat /home/user/f"); f != "precious" {
		t.Fatalf("the kept sandbox sees %q", f)
	}
	if paused, _ := filepath.Glob(filepath.Join(snapDir, "*", "meta.json")); len(paused) > 1 {
		t.Fatalf("a pause snapshot of the sandbox that runs on was left: %v", paused)
	}
	c2.Kill(ctx, sb.SandboxID)
	if n := procsLeft(sb.SandboxID, 10*time.Second); n != 0 {
		t.Fatalf("%d processes of the crashed server's sandbox are still there", n)
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
