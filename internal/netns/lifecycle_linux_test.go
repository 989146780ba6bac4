package netns

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/testutil"
)

// TestNoLeaks: many acquire/release (and recycle) cycles leave nothing but
// the pool's own slots, and Close leaves nothing at all.
func TestNoLeaks(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	const pool = 2
	cfg := testConfig(t, pool)
	m, err := NewManager(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg = m.cfg
	for i := range 50 {
		s, err := m.Acquire(ctx, SlotOptions{AllowInternet: i%2 == 0})
		if err != nil {
			t.Fatalf("cycle %d: Acquire: %v", i, err)
		}
		if i%5 == 4 {
			simulateRunsc(t, s)
			err = m.Recycle(ctx, s)
		} else {
			err = m.Release(ctx, s)
		}
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
	}
	waitPool(t, m, pool)
	// Each pooled slot: two namespace files, two mounts, one host link.
	waitHostState(t, cfg, hostState{files: 2 * pool, mounts: 2 * pool, links: pool, table: true})

	if err := m.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := readHostState(t, cfg); got != (hostState{}) {
		t.Fatalf("after Close: %+v", got)
	}
	if isMountPoint(t, cfg.RunDir) {
		t.Errorf("run directory %s still mounted", cfg.RunDir)
	}
	if err := m.Close(ctx); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := m.Acquire(ctx, SlotOptions{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Acquire after Close: %v, want ErrClosed", err)
	}
}

// TestCloseTakesHeldSlots: held slots do not outlive the host rules that
// isolate them.
func TestCloseTakesHeldSlots(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	cfg := testConfig(t, 1)
	m, err := NewManager(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := acquire(t, m, SlotOptions{AllowInternet: true})
	acquire(t, m, SlotOptions{})
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := readHostState(t, m.cfg); got != (hostState{}) {
		t.Fatalf("after Close: %+v", got)
	}
	if err := m.Release(ctx, s); !errors.Is(err, ErrClosed) {
		t.Errorf("Release after Close: %v, want ErrClosed", err)
	}
}

// TestReap: a restart cleans up after a manager that died without Close.
func TestReap(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	cfg, err := testConfig(t, 1).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	// What a crashed run leaves: slots and the host table, no process.
	if err := os.MkdirAll(cfg.RunDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := installHostTable(cfg); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := buildSlot(cfg, i*7); err != nil {
			t.Fatal(err)
		}
	}
	// Files that are not ours stay.
	foreign := cfg.RunDir + "/notes.txt"
	if err := os.WriteFile(foreign, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := readHostState(t, cfg); got.files != 7 || got.mounts != 6 || got.links != 3 || !got.table {
		t.Fatalf("leftovers not in place: %+v", got)
	}

	m, err := NewManager(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := Reap(ctx, cfg); !errors.Is(err, ErrBusy) {
		t.Errorf("Reap while a manager runs: %v, want ErrBusy", err)
	}
	if _, err := NewManager(ctx, cfg); !errors.Is(err, ErrBusy) {
		t.Errorf("second NewManager on one run directory: %v, want ErrBusy", err)
	}
	waitPool(t, m, 1)
	waitHostState(t, cfg, hostState{files: 3, mounts: 2, links: 1, table: true})
	if err := m.Close(ctx); err != nil {
		t.Fatal(err)
	}

	// Reap on its own, after another crash.
	if _, err := buildSlot(cfg, 3); err != nil {
		t.Fatal(err)
	}
	if err := Reap(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if got := readHostState(t, cfg); got != (hostState{files: 1}) {
		t.Fatalf("after Reap: %+v", got)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("Reap removed a file that is not a slot's: %v", err)
	}
}

func isMountPoint(t testing.TB, dir string) bool {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}
