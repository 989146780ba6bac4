package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/template/erofs"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestRestartKeepsSandboxes runs the restart suite on the embedded etcd.
func TestRestartKeepsSandboxes(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	restartSuite(t, nil, "")
}

// TestRestartKeepsSandboxesLazy runs the suite on a template this server
// has only in the store, served lazily by the node's image server, which
// outlives the server's kill -9: the sandbox's root keeps its files.
func TestRestartKeepsSandboxesLazy(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	testutil.RequireBinary(t, "mkfs.erofs", "")
	storeDir := filepath.Join(t.TempDir(), "store")
	publishBaseCopy(t, storeDir, "lazybase")
	restartSuite(t, []string{"--store", storeDir}, "lazybase")
}

// publishBaseCopy publishes a copy of the base tree as template id to the
// store at dir, as a server elsewhere would after a pull: its block image
// only, which this host does not have.
func publishBaseCopy(t *testing.T, dir, id string) {
	t.Helper()
	backend, err := store.NewLocal(dir)
	must(t, err)
	remote, err := store.New(store.Options{Backend: backend})
	must(t, err)
	defer remote.Close()
	images, err := store.New(agent.ImageStoreOptions(backend))
	must(t, err)
	defer images.Close()
	ts, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(t.TempDir(), "templates"), Remote: remote, Images: images, Blocks: erofs.Images{}})
	must(t, err)
	st, err := ts.NewStage(id)
	must(t, err)
	defer st.Abort()
	if out, err := exec.Command("cp", "-a", os.Getenv("AENV_BASE_ROOTFS")+"/.", st.RootFS()+"/").CombinedOutput(); err != nil {
		t.Fatalf("copying the base tree: %v: %s", err, out)
	}
	must(t, st.Commit(&template.Template{ID: id, CPUCount: 1, MemoryMB: 512}))
}

// TestRestartKeepsSandboxesExternalEtcd runs the same suite against an
// external etcd member running as its own process.
func TestRestartKeepsSandboxesExternalEtcd(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	m := startEtcdProc(t, t.TempDir())
	defer m.stop()
	restartSuite(t, []string{"--etcd-endpoints", m.url}, "")
}

// restartSuite: a sandbox with a counter running in memory survives kill -9
// of the server and a SIGTERM, and keeps counting, with its files and
// envd processes intact; a timeout that passed while the server was down
// is enforced after the restart; a paused sandbox resumes after a
// restart; records and sandboxes reconcile both ways.
func restartSuite(t *testing.T, extra []string, templateID string) {
	dir := t.TempDir()
	dataDir, runDir := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	ctx := context.Background()
	p := startServerProc(t, dataDir, runDir, extra...)
	defer func() {
		p.stop(t, 60*time.Second)
		if t.Failed() {
			t.Logf("server log (without debug lines):\n%s", logWithout(p.log, "level=DEBUG"))
		}
		// What the stopped server kept must not outlive the test.
		if err := agent.Cleanup(context.Background(), agent.Config{DataDir: dataDir, RunDir: runDir, NetnsTag: "crasht", SandboxCIDR: "10.238.0.0/16"}); err != nil {
			t.Errorf("cleaning up: %v", err)
		}
	}()
	c := client.New(p.url, p.key)

	if _, err := c.CreateVolume(ctx, "kept", client.VolumeOptions{SizeMB: 32}); err != nil {
		t.Fatal(err)
	}
	keep, err := c.Create(ctx, client.CreateOptions{Timeout: 600, TemplateID: templateID,
		VolumeMounts: []client.VolumeMount{{Name: "kept", Path: "/mnt/kept"}}})
	if err != nil {
		t.Fatal(err)
	}
	runOut(t, c, keep.SandboxID, "echo precious > /home/user/f && echo on the volume > /mnt/kept/v")
	runOut(t, c, keep.SandboxID, counterCmd)
	// A long-lived envd process, started through the API.
	runOut(t, c, keep.SandboxID, "nohup sleep 3600 >/dev/null 2>&1 & echo $! > /tmp/sleeper")
	sleeper := runOut(t, c, keep.SandboxID, "cat /tmp/sleeper")
	short, err := c.Create(ctx, client.CreateOptions{Timeout: 4, TemplateID: templateID})
	if err != nil {
		t.Fatal(err)
	}
	paused, err := c.Create(ctx, client.CreateOptions{Timeout: 600, TemplateID: templateID})
	if err != nil {
		t.Fatal(err)
	}
	runOut(t, c, paused.SandboxID, "echo asleep > /home/user/p")
	if err := c.Pause(ctx, paused.SandboxID); err != nil {
		t.Fatal(err)
	}
	before := counter(t, c, keep.SandboxID)
	// The node's local record, which a restart adopts, holds the envd
	// token sealed (it opens again below: the restarted sandbox answers).
	rec, err := os.ReadFile(filepath.Join(runDir, "node", "sandboxes", keep.SandboxID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if keep.EnvdAccessToken == "" || strings.Contains(string(rec), keep.EnvdAccessToken) {
		t.Fatalf("the node's local record holds the envd token %q in clear: %s", keep.EnvdAccessToken, rec)
	}

	// kill -9, and stay down past the short sandbox's deadline.
	p.kill9()
	time.Sleep(5 * time.Second)
	p = startServerProc(t, dataDir, runDir, extra...)
	c = client.New(p.url, p.key)
	t.Logf("restarted after kill -9: serving %s after the process started", p.ready)
	if got := counter(t, c, keep.SandboxID); got <= before {
		t.Fatalf("counter after kill -9 and restart is %d, was %d: the sandbox's memory was lost", got, before)
	}
	if f := runOut(t, c, keep.SandboxID, "cat /home/user/f"); f != "precious" {
		t.Fatalf("file after restart: %q", f)
	}
	// The volume stays mounted, bounded, and envd's log is read again
	// (the new process copies its FIFO into the log).
	if v := runOut(t, c, keep.SandboxID, "cat /mnt/kept/v && df -m /mnt/kept | tail -1 | awk '{print $2}'"); !strings.HasPrefix(v, "on the volume\n") || v == "on the volume\n0" {
		t.Fatalf("the volume after restart: %q", v)
	}
	restarted := time.Now()
	runOut(t, c, keep.SandboxID, "echo after the restart")
	logs, err := c.Logs(ctx, keep.SandboxID, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(logs); n == 0 || !strings.HasPrefix(logs[n-1].Message, "process ") || logs[n-1].Timestamp.Before(restarted.Add(-time.Second)) {
		t.Fatalf("envd's log after restart ends with %+v, not the process run then", logs[max(0, len(logs)-2):])
	}
	// Files of the template nothing read before the restart (on a lazy
	// template: fetched now, by the image server that outlived it).
	if n := runOut(t, c, keep.SandboxID, "find /usr/lib -type f -name '*.so*' | head -40 | xargs cat | wc -c"); n == "0" || n == "" {
		t.Fatalf("reading the template's files after the restart: %q", n)
	}
	if out := runOut(t, c, keep.SandboxID, "kill -0 "+sleeper+" && echo alive"); out != "alive" {
		t.Fatalf("the envd process %s did not survive: %q", sleeper, out)
	}
	waitGone(t, c, short.SandboxID, 10*time.Second)
	if n := procsLeft(short.SandboxID, 10*time.Second); n != 0 {
		t.Errorf("%d processes of the timed-out sandbox remain", n)
	}

	// SIGTERM keeps sandboxes running too.
	before = counter(t, c, keep.SandboxID)
	p.stop(t, 60*time.Second)
	if n := sandboxProcs(keep.SandboxID); n == 0 {
		t.Fatal("SIGTERM killed the running sandbox")
	}
	p = startServerProc(t, dataDir, runDir, extra...)
	c = client.New(p.url, p.key)
	if got := counter(t, c, keep.SandboxID); got <= before {
		t.Fatalf("counter after SIGTERM and restart is %d, was %d", got, before)
	}
	sb, resumed, err := c.Connect(ctx, paused.SandboxID, time.Minute)
	if err != nil || !resumed {
		t.Fatalf("resuming the paused sandbox after restarts: %+v resumed=%v %v", sb, resumed, err)
	}
	if f := runOut(t, c, paused.SandboxID, "cat /home/user/p"); f != "asleep" {
		t.Fatalf("resumed sandbox's file: %q", f)
	}

	// Reconcile both ways, behind a stopped server's back: one sandbox
	// dies, and another loses its record.
	p.stop(t, 60*time.Second)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	del := exec.Command(runsc, "--root", filepath.Join(runDir, "gvisor", "runsc"), "delete", "--force", keep.SandboxID)
	if out, err := del.CombinedOutput(); err != nil {
		t.Fatalf("runsc delete: %v: %s", err, out)
	}
	deleteRecord(t, dataDir, extra, paused.SandboxID)
	p = startServerProc(t, dataDir, runDir, extra...)
	c = client.New(p.url, p.key)
	_, err = c.Get(ctx, keep.SandboxID)
	if !isStatus(err, 404) || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("a sandbox that died while the server was down: %v, want 404 saying it was lost", err)
	}
	if b, _ := os.ReadFile(p.log); !strings.Contains(string(b), "sandbox lost") {
		t.Errorf("the server log does not say the sandbox was lost")
	}
	if _, err := c.Get(ctx, paused.SandboxID); !isStatus(err, 404) {
		t.Fatalf("a sandbox without a record: %v, want 404", err)
	}
	if n := procsLeft(paused.SandboxID, 10*time.Second); n != 0 {
		t.Fatalf("a sandbox without a record still has %d processes", n)
	}
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Fatalf("sandboxes listed after reconciling: %+v", list)
	}
}

// waitGone waits until id answers 404.
func waitGone(t *testing.T, c *client.Client, id string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		_, err := c.Get(context.Background(), id)
		if isStatus(err, 404) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s still answers after %s: %v", id, limit, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// deleteRecord removes a sandbox's record from a stopped server's state.
func deleteRecord(t *testing.T, dataDir string, extra []string, id string) {
	t.Helper()
	cfg := state.Config{DataDir: filepath.Join(dataDir, "etcd"), SocketDir: t.TempDir()}
	if len(extra) == 2 && extra[0] == "--etcd-endpoints" {
		cfg = state.Config{Endpoints: []string{extra[1]}}
	}
	ctx := context.Background()
	st, err := state.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Delete(ctx, "sandboxes/"+id, 0); err != nil {
		t.Fatalf("deleting record of %s: %v", id, err)
	}
}

// etcdProc is `aenv etcd` run as a separate process: an external etcd.
type etcdProc struct {
	cmd   *exec.Cmd
	url   string
	waitc <-chan struct{}
	args  []string
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startEtcdProc(t *testing.T, dir string) *etcdProc {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("AENV_BIN_DIR") == "" {
		testutil.Unavailable(t, "AENV_BIN_DIR must be set (make build)")
	}
	client, peer := freePort(t), freePort(t)
	m := &etcdProc{url: "http://127.0.0.1:" + strconv.Itoa(client), args: []string{"etcd", "--name", "ext",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client", fmt.Sprintf("http://127.0.0.1:%d", client),
		"--listen-peer", fmt.Sprintf("http://127.0.0.1:%d", peer), "--new", "--log-level", "warn"}}
	m.start(t, filepath.Join(dir, "etcd.log"))
	return m
}

func (m *etcdProc) start(t *testing.T, logPath string) {
	t.Helper()
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	m.cmd = exec.Command(filepath.Join(os.Getenv("AENV_BIN_DIR"), "aenv"), m.args...)
	m.cmd.Stdout, m.cmd.Stderr = logf, logf
	if m.waitc, err = testutil.StartTied(m.cmd); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(m.url + "/health"); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("etcd member did not come up; log %s:\n%s", logPath, tail(logPath))
}

func (m *etcdProc) stop() {
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.waitc
}

// logWithout returns a log file's lines that do not contain drop.
func logWithout(path, drop string) string {
	b, _ := os.ReadFile(path)
	var keep []string
	for _, l := range strings.Split(string(b), "\n") {
		if !strings.Contains(l, drop) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// TestEtcdOutage: a server whose external etcd is down at start waits for
// it, saying so, without exiting; while etcd is down later the API answers
// 503 {code, message} and running sandboxes keep working; service resumes
// by itself when etcd is back.
func TestEtcdOutage(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	dir := t.TempDir()
	m := &etcdProc{}
	etcdDir := filepath.Join(dir, "etcd-member")
	mm := startEtcdProc(t, etcdDir)
	mm.stop()
	*m = *mm
	dataDir, runDir := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	// Also when the server failed to start, after what it made.
	t.Cleanup(func() {
		agent.Cleanup(context.Background(), agent.Config{RunDir: runDir, NetnsTag: "crasht", SandboxCIDR: "10.238.0.0/16"})
	})

	// Down at start: the server waits and says why. It is started on
	// another goroutine, which must not fail the test itself: what went
	// wrong comes back on the channel.
	type started struct {
		p   *serverProc
		err error
	}
	done := make(chan started, 1)
	go func() {
		p, err := launchServerProc(dataDir, runDir, "--etcd-endpoints", m.url)
		done <- started{p, err}
	}()
	logPath := filepath.Join(dir, "server.log")
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "unavailable") && strings.Contains(string(b), "retrying") {
			break
		}
		if time.Now().After(deadline) {
			// The start gives up within its own minute; nothing may be
			// left running.
			if r := <-done; r.p != nil {
				r.p.stop(t, 60*time.Second)
			}
			t.Fatalf("no log line says etcd is unavailable and retried:\n%s", tail(logPath))
		}
		time.Sleep(200 * time.Millisecond)
	}
	m.start(t, filepath.Join(etcdDir, "etcd.log"))
	defer m.stop()
	r := <-done
	if r.err != nil {
		t.Fatalf("starting the server while etcd was down: %v", r.err)
	}
	p := r.p
	defer p.stop(t, 60*time.Second)
	ctx := context.Background()
	c := client.New(p.url, p.key)
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}

	m.stop()
	_, err = c.Create(ctx, client.CreateOptions{Timeout: 300})
	var apiErr *client.APIError
	if !errors.As(err, &apiErr) || apiErr.Status != 503 || apiErr.Message == "" {
		t.Fatalf("create with etcd down: %v, want 503 with a message", err)
	}
	if out := runOut(t, c, sb.SandboxID, "echo still here"); out != "still here" {
		t.Fatalf("a running sandbox while etcd is down: %q", out)
	}
	if sandboxes := runningSandboxes(t, runDir); sandboxes != 1 {
		t.Fatalf("%d sandboxes run after a refused create, want 1", sandboxes)
	}

	m.start(t, filepath.Join(etcdDir, "etcd.log"))
	deadline = time.Now().Add(30 * time.Second)
	for {
		sb2, err := c.Create(ctx, client.CreateOptions{Timeout: 300})
		if err == nil {
			c.Kill(ctx, sb2.SandboxID)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("creates still fail 30s after etcd came back: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	c.Kill(ctx, sb.SandboxID)
}

// runningSandboxes counts the sandbox directories of a server's runtime.
func runningSandboxes(t *testing.T, runDir string) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(runDir, "gvisor", "sandboxes"))
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// TestDrainOnStop: with --drain-on-stop, SIGTERM pauses every running
// sandbox (nothing of them is left running), and the next start resumes
// them on connect with their memory.
func TestDrainOnStop(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	dir := t.TempDir()
	dataDir, runDir := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	ctx := context.Background()
	p := startServerProc(t, dataDir, runDir, "--drain-on-stop")
	defer func() {
		p.stop(t, 60*time.Second)
		agent.Cleanup(context.Background(), agent.Config{RunDir: runDir, NetnsTag: "crasht", SandboxCIDR: "10.238.0.0/16"})
	}()
	c := client.New(p.url, p.key)
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 600})
	if err != nil {
		t.Fatal(err)
	}
	runOut(t, c, sb.SandboxID, counterCmd)
	time.Sleep(300 * time.Millisecond)
	before := counter(t, c, sb.SandboxID)
	p.stop(t, 2*time.Minute)
	if n := sandboxProcs(sb.SandboxID); n != 0 {
		t.Fatalf("%d processes of the sandbox run after a draining stop", n)
	}
	p = startServerProc(t, dataDir, runDir)
	c = client.New(p.url, p.key)
	info, err := c.Get(ctx, sb.SandboxID)
	if err != nil || info.State != "paused" {
		t.Fatalf("after a draining stop the sandbox is %+v, %v; want paused", info, err)
	}
	if _, resumed, err := c.Connect(ctx, sb.SandboxID, time.Minute); err != nil || !resumed {
		t.Fatalf("resuming a drained sandbox: resumed=%v %v", resumed, err)
	}
	if got := counter(t, c, sb.SandboxID); got < before {
		t.Fatalf("the drained sandbox's counter went from %d to %d: its memory was lost", before, got)
	}
	c.Kill(ctx, sb.SandboxID)
}
