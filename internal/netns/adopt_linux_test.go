package netns

import (
	"context"
	"errors"
	"testing"

	"github.com/aenvhq/aenv/internal/testutil"
)

// TestDetachAndAdopt: a manager that detaches leaves its held slots
// working (the sandboxes in them outlive a restart); the next manager
// adopts the ones still wanted, with their egress rules, and releases the
// rest.
func TestDetachAndAdopt(t *testing.T) {
	testutil.RequireRoot(t)
	ctx := context.Background()
	cfg := testConfig(t, 1)
	cfg.KeepLeftovers = true
	m, err := NewManager(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	keep := acquire(t, m, SlotOptions{})
	drop := acquire(t, m, SlotOptions{AllowInternet: true})
	listenIn(t, keep.SandboxNSPath, envdInside, "K")
	listenIn(t, drop.SandboxNSPath, envdInside, "D")
	waitPool(t, m, 1)
	if err := m.Detach(ctx); err != nil {
		t.Fatal(err)
	}
	// Between the two managers the sandboxes still answer.
	mustReach(t, "", hostPort(keep.HostAddr, envdPort), "K")
	mustReach(t, "", hostPort(drop.HostAddr, envdPort), "D")

	m2, err := NewManager(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m2.Close(ctx) })
	got, err := m2.Adopt(keep.Name)
	if err != nil {
		t.Fatal(err)
	}
	if got.HostAddr != keep.HostAddr || got.SandboxNSPath != keep.SandboxNSPath {
		t.Fatalf("adopted %+v, want %+v", got, keep)
	}
	if _, err := m2.Adopt(keep.Name); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Adopt: %v, want ErrNotHeld", err)
	}
	if err := m2.ReleaseLeftovers(ctx); err != nil {
		t.Fatal(err)
	}
	mustReach(t, "", hostPort(keep.HostAddr, envdPort), "K")
	if got, err := dialFrom("", hostPort(drop.HostAddr, envdPort), blockedTimeout); err == nil {
		t.Errorf("released leftover still answers as %q", got)
	}
	// The adopted slot is held like any other: a new slot never reuses
	// its index, and Release frees it.
	for range 3 {
		s := acquire(t, m2, SlotOptions{})
		if s.Index == got.Index {
			t.Fatalf("new slot reuses the adopted slot's index %d", s.Index)
		}
	}
	if err := m2.UpdateEgress(ctx, got, SlotOptions{AllowInternet: true}); err != nil {
		t.Fatalf("UpdateEgress on an adopted slot: %v", err)
	}
	if err := m2.Release(ctx, got); err != nil {
		t.Fatal(err)
	}
}
