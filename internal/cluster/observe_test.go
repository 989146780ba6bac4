package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	sched "github.com/aenvhq/aenv/internal/placement"
	"github.com/aenvhq/aenv/internal/state"
)

// TestObservedFigures: what /metrics exports of the cluster. A node's
// report carries its image cache into the registry (Nodes); SandboxUsage
// has the last sample of every running sandbox on every node, and none
// of a sandbox killed; refusals are counted by cause, a node's own
// refusal of what placement chose for it included.
func TestObservedFigures(t *testing.T) {
	ctx := context.Background()
	n1, n2 := nodetest.NewFake("n1"), nodetest.NewFake("n2")
	cache := &nodev1.ImageCache{Bytes: 3 << 20, MaxBytes: 10 << 20, Hits: 90, Misses: 10, Evictions: 2, Mounted: 1}
	n1.SetImageCache(cache)
	c, _ := remoteFleet(t, state.NewMemory(), n1, n2)

	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 2 {
		t.Fatalf("nodes: %+v, %v", nodes, err)
	}
	got := nodes[0].ImageCache
	if got == nil || got.Bytes != 3<<20 || got.MaxBytes != 10<<20 || got.Hits != 90 || got.Misses != 10 || got.Evictions != 2 || got.Mounted != 1 {
		t.Errorf("n1's image cache in the registry: %+v; want what it reported, %v", got, cache)
	}
	if nodes[1].ImageCache != nil {
		t.Errorf("n2 reports no image cache, its record has %+v", nodes[1].ImageCache)
	}

	a, b := create(t, c, time.Hour), create(t, c, time.Hour)
	byID := map[string]SandboxUsage{}
	for _, u := range c.SandboxUsage(ctx) {
		byID[u.ID] = u
	}
	for _, sb := range []*Sandbox{a, b} {
		if u, ok := byID[sb.ID]; !ok || u.NodeID != sb.NodeID || u.MemUsed != nodetest.FakeMemUsed || u.CPUUsedPct != 50 || u.At.IsZero() {
			t.Errorf("usage of %s (on %s): %+v, %v", sb.ID, sb.NodeID, u, ok)
		}
	}
	if len(byID) != 2 {
		t.Errorf("usage of %d sandboxes, want 2: %+v", len(byID), byID)
	}
	if err := c.Kill(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if us := c.SandboxUsage(ctx); len(us) != 1 || us[0].ID != b.ID {
		t.Errorf("usage once %s is killed: %+v, want %s's only", a.ID, us, b.ID)
	}

	before := c.PlacementRefusals()
	if len(before) != len(RefusalCauses()) {
		t.Errorf("refusals %v: want every cause, zero included", before)
	}
	if _, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute, MemoryMB: 8192}, TemplateID: "base"}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a sandbox larger than every node: %v", err)
	}
	// n1 refuses on its own; the retry finds only n2, which drains.
	n1.SetFull(true)
	if _, err := c.SetDraining(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute}, TemplateID: "base"}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("a create n1 refuses with n2 draining: %v, want ErrNoCapacity", err)
	}
	after := c.PlacementRefusals()
	for cause, want := range map[string]uint64{string(sched.CauseTooLarge): 1, RefusedByNode: 1, string(sched.CauseDraining): 1, string(sched.CauseNoRoom): 0} {
		if d := after[cause] - before[cause]; d != want {
			t.Errorf("refusals for %s: %d more, want %d (%v)", cause, d, want, after)
		}
	}
}
