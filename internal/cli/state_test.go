package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/state"
)

// TestStateBackupRestore: `aenv state backup` takes a snapshot of a
// running server's etcd through its socket; `aenv state restore` puts it
// back into a stopped server's data directory, where the sandbox records
// are found again.
func TestStateBackupRestore(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base")
	backup := filepath.Join(t.TempDir(), "state.db")
	out := e.mustRun(t, "state", "backup", "--run-dir", filepath.Join(shared.dir, "run"), backup)
	if !strings.Contains(out, "backed up") {
		t.Fatalf("backup printed %q", out)
	}
	if fi, err := os.Stat(backup); err != nil || fi.Size() == 0 {
		t.Fatalf("backup file: %v", err)
	}

	dataDir := filepath.Join(t.TempDir(), "data")
	out = e.mustRun(t, "state", "restore", "--data-dir", dataDir, backup)
	if !strings.Contains(out, "restored") {
		t.Fatalf("restore printed %q", out)
	}
	ctx := context.Background()
	st, err := state.Open(ctx, state.Config{DataDir: filepath.Join(dataDir, "etcd"), SocketDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.Get(ctx, "sandboxes/"+id); err != nil {
		t.Fatalf("the restored state lacks sandbox %s: %v", id, err)
	}

	// A second restore keeps the first restore's data aside, not deleted.
	e.mustRun(t, "state", "restore", "--data-dir", t.TempDir(), backup)
	if r := e.run(t, "", "state", "restore", "--data-dir", dataDir, filepath.Join(t.TempDir(), "missing.db")); r.code == 0 {
		t.Fatal("restoring from a missing file succeeded")
	}
	if _, err := os.Stat(filepath.Join(dataDir, "etcd")); err != nil {
		t.Fatalf("a failed restore removed the current state: %v", err)
	}
}
