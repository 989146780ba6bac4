package gvisor

import (
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/aenvhq/aenv/internal/runtime/cgroups"
)

// TestCloseStopsWatchingExits: the exit watcher belongs to the driver;
// Close ends it (and closes Exits, so that readers end too) instead of
// leaving it polling for the life of the process. It needs no root: the
// driver runs over a fake cgroup tree and starts no sandbox.
func TestCloseStopsWatchingExits(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	root := t.TempDir()
	for _, c := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if err := os.Mkdir(filepath.Join(root, c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cg, err := cgroups.Open(cgroups.Options{Root: root})
	if err != nil {
		t.Fatal(err)
	}
	// New only checks that runsc is there: any file does.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{RunscPath: exe, StateDir: t.TempDir(), Cgroups: cg, PidsTotal: 100, CgroupParent: "/aenvleak"})
	if err != nil {
		t.Fatal(err)
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
