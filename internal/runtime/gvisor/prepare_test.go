package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/runtime"
)

// TestRestorePrepared: a prepared sandbox runs nothing until a state is
// restored into it; then the saved envd answers in the prepared
// sandbox's network, with what it held when it was saved, under the host
// name the restore gave. A restore that fails removes the prepared
// sandbox, and Kill removes one never used. All of it through the runsc
// server (aenv's runsc build), and again with a runsc process each.
func TestRestorePrepared(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		f := setup(t)
		if f.driver.serve == nil {
			t.Fatalf("the driver has no runsc server: %v", requireEdit(f.driver.cfg.RunscPath, serveEdit))
		}
		testRestorePrepared(t, f)
		// A checkpoint, two restores (one failing) and four deletes.
		if n := f.driver.serve.answered.Load(); n < 7 {
			t.Errorf("the runsc server answered %d requests, want at least 7", n)
		}
	})
	t.Run("cli", func(t *testing.T) {
		f := setup(t)
		f.driver.serve = nil
		testRestorePrepared(t, f)
	})
}

func testRestorePrepared(t *testing.T, f *fixture) {
	ctx := context.Background()
	t.Cleanup(func() { f.driver.Close() })

	saved, slot := f.spec(t, "gvtestps")
	if err := f.driver.Create(ctx, saved); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.driver.Kill(context.Background(), saved.ID) })
	waitHealth(t, slot.HostAddr)
	// envd's state: an environment variable set through /init.
	res, err := http.Post(fmt.Sprintf("http://%s:49983/init", slot.HostAddr), "application/json",
		strings.NewReader(`{"envVars":{"AENV_MARK":"before-save"}}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	img := t.TempDir()
	if err := f.driver.Checkpoint(ctx, saved.ID, img, runtime.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := f.driver.Kill(ctx, saved.ID); err != nil {
		t.Fatal(err)
	}

	prep, pslot := f.spec(t, "gvtestpp")
	if err := f.driver.Prepare(ctx, prep); err != nil {
		t.Fatal(err)
	}
	if answers(pslot.HostAddr) {
		t.Fatal("a prepared sandbox answers before anything was restored into it")
	}
	prep.Hostname = "gvtestchild"
	start := time.Now()
	if err := f.driver.RestorePrepared(ctx, prep, img); err != nil {
		t.Fatal(err)
	}
	t.Logf("restore into a prepared sandbox took %v", time.Since(start))
	waitHealth(t, pslot.HostAddr)
	if got := envdEnv(t, pslot.HostAddr, "AENV_MARK"); got != "before-save" {
		t.Errorf("the restored envd has AENV_MARK=%q, want the saved before-save", got)
	}
	hosts, err := os.ReadFile(filepath.Join(f.driver.sandboxDir(prep.ID), "hosts"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(hosts), "gvtestchild") {
		t.Errorf("/etc/hosts of the restored sandbox names no gvtestchild:\n%s", hosts)
	}
	if _, err := f.driver.Stats(ctx, prep.ID); err != nil {
		t.Errorf("stats of the restored sandbox: %v", err)
	}
	killGone(t, f, prep.ID)

	// A state that cannot load leaves nothing of the prepared sandbox.
	bad, _ := f.spec(t, "gvtestpb")
	if err := f.driver.Prepare(ctx, bad); err != nil {
		t.Fatal(err)
	}
	if err := f.driver.RestorePrepared(ctx, bad, t.TempDir()); err == nil {
		t.Fatal("restoring an empty image into a prepared sandbox succeeded")
	}
	if _, err := os.Stat(f.driver.sandboxDir(bad.ID)); !os.IsNotExist(err) {
		t.Errorf("a failed restore left the prepared sandbox's dir: %v", err)
	}
	if err := f.driver.RestorePrepared(ctx, bad, img); err == nil {
		t.Error("restoring into a prepared sandbox already gone succeeded")
	}

	unused, _ := f.spec(t, "gvtestpu")
	if err := f.driver.Prepare(ctx, unused); err != nil {
		t.Fatal(err)
	}
	killGone(t, f, unused.ID)
}

// procStat returns the fields of /proc/PID/stat after the command's
// closing parenthesis (the state first, nice the 17th), or an error when
// there is no such process.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:])), nil
}

// killGone kills sandbox id, the last the driver runs, and checks that
// nothing of it is left: its sandbox process has ended and runsc knows
// no container.
func killGone(t *testing.T, f *fixture, id string) {
	t.Helper()
	pid, err := readPid(filepath.Join(f.driver.sandboxDir(id), "pid"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.driver.Kill(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	// A zombie has ended: its parent, init here, reaps it later.
	if st, err := procStat(pid); err == nil && len(st) > 0 && st[0] != "Z" {
		t.Errorf("the sandbox process of %s (pid %d) still runs after its kill", id, pid)
	}
	list, err := f.driver.runc.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Fatalf("runsc still knows containers after %s was killed: %+v", id, list)
	}
}

// envdEnv reads variable name from envd's environment at addr.
func envdEnv(t *testing.T, addr netip.Addr, name string) string {
	t.Helper()
	res, err := http.Get(fmt.Sprintf("http://%s:49983/envs", addr))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var envs map[string]string
	if err := json.NewDecoder(res.Body).Decode(&envs); err != nil {
		t.Fatal(err)
	}
	return envs[name]
}

// TestRunscServerRestarts: a runsc server that died is started again by
// the next request, and while none can start the driver deletes with a
// runsc process of its own; either way the container is gone.
func TestRunscServerRestarts(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	t.Cleanup(func() { f.driver.Close() })
	if f.driver.serve == nil {
		t.Fatalf("the driver has no runsc server: %v", requireEdit(f.driver.cfg.RunscPath, serveEdit))
	}
	srv := f.driver.serve
	createKill := func(name string) {
		t.Helper()
		spec, _ := f.spec(t, name)
		if err := f.driver.Create(ctx, spec); err != nil {
			t.Fatal(err)
		}
		killGone(t, f, spec.ID)
	}
	killServer := func() {
		t.Helper()
		srv.mu.Lock()
		proc, exited := srv.proc, srv.exited
		srv.mu.Unlock()
		if err := proc.Kill(); err != nil {
			t.Fatal(err)
		}
		<-exited
	}

	createKill("gvtestsa")
	if n := srv.answered.Load(); n != 1 {
		t.Fatalf("the runsc server answered %d requests, want 1", n)
	}
	pid := func() int {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.proc.Pid
	}
	first := pid()
	killServer()
	createKill("gvtestsb")
	if n := srv.answered.Load(); n != 2 {
		t.Errorf("after its death the runsc server answered %d requests in all, want 2", n)
	}
	if pid() == first {
		t.Errorf("the runsc server was not started again (pid %d)", first)
	}

	// runsc replaced under the driver, as an upgrade does: the next request
	// goes to a server of the new binary, and the old server ends.
	bin := filepath.Join(t.TempDir(), "runsc")
	data, err := os.ReadFile(srv.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	data = nil
	srv.mu.Lock()
	srv.path = bin
	srv.mu.Unlock()
	for i, name := range []string{"gvtestsr", "gvtestss"} {
		srv.mu.Lock()
		old, oldExited := srv.proc.Pid, srv.exited
		srv.mu.Unlock()
		if i == 1 {
			// Rewritten in place: the same file, a new time.
			later := time.Now().Add(time.Minute)
			if err := os.Chtimes(bin, later, later); err != nil {
				t.Fatal(err)
			}
		}
		createKill(name)
		if pid() == old {
			t.Fatalf("replacement %d: the request went to the old runsc server (pid %d)", i, old)
		}
		select {
		case <-oldExited:
		case <-time.After(10 * time.Second):
			t.Fatalf("replacement %d: the old runsc server (pid %d) still runs 10 s after its binary was replaced", i, old)
		}
	}
	if n := srv.answered.Load(); n != 4 {
		t.Errorf("after two replacements the runsc servers answered %d requests in all, want 4", n)
	}

	// A server that cannot start: the driver runs runsc itself.
	killServer()
	srv.mu.Lock()
	srv.path = filepath.Join(t.TempDir(), "runsc-missing")
	srv.mu.Unlock()
	createKill("gvtestsc")
	if n := srv.answered.Load(); n != 4 {
		t.Errorf("the runsc server answered %d requests in all, want still 4", n)
	}
	srv.mu.Lock()
	failed := srv.failedAt
	srv.mu.Unlock()
	if failed.IsZero() {
		t.Error("a server that failed to start is not held off (failedAt unset)")
	}
}
