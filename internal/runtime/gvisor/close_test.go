package gvisor

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/aenvhq/aenv/internal/runtime/cgroups"
)

// TestCloseStopsWatchingExits: the exit watcher belongs to the driver;
// Close ends it (and closes Exits, so that readers end too) instead of
// leaving it polling for the life of the process. New also warns about a
// low kernel.pid_max. It needs no root: the
// driver runs over a fake cgroup tree and starts no sandbox.
func TestCloseStopsWatchingExits(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cg, root, exe := fakeHost(t)
	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	d, err := New(Config{RunscPath: exe, StateDir: t.TempDir(), Cgroups: cg, PidsTotal: 100, CgroupParent: "/aenvleak", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	// The server says when the host's pid_max leaves sandboxes little room.
	pidMax, err := readUint("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	if warned := strings.Contains(logs.String(), "kernel.pid_max=4194304"); warned != (pidMax < PidMaxWanted) {
		t.Fatalf("kernel.pid_max is %d; warned %v: %s", pidMax, warned, logs.String())
	}
	if b, err := os.ReadFile(filepath.Join(root, "pids/aenvleak/pids.max")); err != nil || string(b) != "100" {
		t.Fatalf("the sandboxes' pids cgroup says %q, %v; want PidsTotal 100", b, err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, open := <-d.Exits(); open {
		t.Fatal("Exits still open after Close")
	}
	// A second Close (a server stopping twice) must not panic.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
}

// fakeHost is what New needs of a host without root: a fake cgroup v1
// tree (the hierarchy, and its root directory) and a runsc that refuses
// every command, as a stock runsc refuses `runsc aenv-edits`, the one
// command New runs. (The test binary itself once stood for it: asked
// for aenv-edits, it ran this package's tests again, each of which
// asked it again.)
func fakeHost(t *testing.T) (cg cgroups.Hierarchy, root, runsc string) {
	t.Helper()
	root = t.TempDir()
	for _, c := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if err := os.Mkdir(filepath.Join(root, c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cg, err := cgroups.Open(cgroups.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	runsc = filepath.Join(t.TempDir(), "runsc")
	if err := os.WriteFile(runsc, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return cg, root, runsc
}
