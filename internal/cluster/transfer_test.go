package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// storelessFleet is remoteFleet over two nodes that share no snapshot
// store, n1 holding template "custom" (one a build made there) that n2
// lacks, with a sandbox of it on n1.
func storelessFleet(t *testing.T) (*Cluster, map[string]*membership.Registration, *nodetest.Fake, *nodetest.Fake, *Sandbox) {
	t.Helper()
	ctx := context.Background()
	n1, n2 := nodetest.NewFake("n1"), nodetest.NewFake("n2")
	n1.AddTemplate("custom")
	c, regs := remoteFleet(t, state.NewMemory(), n1, n2)
	if _, err := c.SetDraining(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	sb, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Hour}, TemplateID: "custom", EnvVars: map[string]string{"K": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetDraining(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}
	if sb.NodeID != "n1" {
		t.Fatalf("placed on %s, want n1", sb.NodeID)
	}
	return c, regs, n1, n2, sb
}

// TestMigrateWithoutStore: with no store the nodes share, a migration
// relays the snapshot from the node that took it to the new one, with the
// template it runs on, which that node lacked; the sandbox runs there
// with its environment, and no copy of the snapshot outlives the move on
// either node. A relay cut midway resumes where it stopped.
func TestMigrateWithoutStore(t *testing.T) {
	ctx := context.Background()
	c, _, n1, n2, sb := storelessFleet(t)
	n1.CutExport(3)
	m, err := c.Migrate(ctx, sb.ID, "n2")
	if err != nil {
		t.Fatal(err)
	}
	if m.Sandbox.NodeID != "n2" || !n2.IsRunning(sb.ID) || n1.IsRunning(sb.ID) {
		t.Fatalf("after the migration: %+v; runs on n1 %v, n2 %v", m.Sandbox, n1.IsRunning(sb.ID), n2.IsRunning(sb.ID))
	}
	if got := n2.EnvVars(sb.ID); got["K"] != "v" {
		t.Fatalf("the moved sandbox's environment: %v", got)
	}
	if !n2.HasTemplate("custom") {
		t.Fatal("the template did not come along with the snapshot")
	}
	if got := n1.Exports(); got != 2 {
		t.Fatalf("%d exports for a relay cut once, want 2 (the cut one and its resume)", got)
	}
	waitFor(t, func() bool { return n1.SnapshotCount() == 0 && n2.SnapshotCount() == 0 },
		"the migration's snapshot to be deleted on both nodes")
	// Back to n1, which has the template: only the snapshot moves.
	if _, err := c.Migrate(ctx, sb.ID, "n1"); err != nil {
		t.Fatal(err)
	}
	if !n1.IsRunning(sb.ID) || n2.IsRunning(sb.ID) {
		t.Fatal("the sandbox did not move back")
	}
}

// TestResumeElsewhereWithoutStore: a paused sandbox whose node is full
// resumes on another node, which gets its snapshot from the node that
// paused it; once the node that paused it is gone, with no store, a
// resume elsewhere is ErrConflict naming the sandbox and why, and the
// sandbox stays paused.
func TestResumeElsewhereWithoutStore(t *testing.T) {
	ctx := context.Background()
	c, regs, n1, n2, sb := storelessFleet(t)
	if err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	n1.SetFull(true)
	got, resumed, err := c.Connect(ctx, sb.ID, time.Minute)
	if err != nil || !resumed || got.NodeID != "n2" || !n2.IsRunning(sb.ID) {
		t.Fatalf("resuming on another node: %+v %v %v", got, resumed, err)
	}
	if n2.EnvVars(sb.ID)["K"] != "v" {
		t.Fatalf("the resumed sandbox's environment: %v", n2.EnvVars(sb.ID))
	}
	waitFor(t, func() bool { return n1.SnapshotCount() == 0 && n2.SnapshotCount() == 0 },
		"the consumed pause snapshot to be deleted on both nodes")

	// Paused on n2, which then goes away.
	if err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	n1.SetFull(false)
	regs["n2"].Stop()
	if err := membership.DeregisterNode(ctx, c.cfg.State, "n2"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		_, err := c.nodes.node("n2")
		return err != nil
	}, "node n2 to be gone")
	_, _, err = c.Connect(ctx, sb.ID, time.Minute)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), sb.ID) || !strings.Contains(err.Error(), "node n2") ||
		!strings.Contains(err.Error(), "no store") {
		t.Fatalf("resuming a sandbox whose snapshot went with its node: %v, want ErrConflict saying why", err)
	}
	if cur, err := c.Get(ctx, sb.ID); err != nil || cur.State != StatePaused {
		t.Fatalf("after the refused resume: %+v %v; want it paused", cur, err)
	}
}

// TestDrainWithoutStore: a node going away with no store the nodes share
// has its sandboxes moved off it, several at a time, each snapshot relayed
// to the node that takes it (the template once it is there); none is
// left paused on the node that leaves, and no copy of a snapshot stays.
func TestDrainWithoutStore(t *testing.T) {
	ctx := context.Background()
	c, _, n1, n2, first := storelessFleet(t)
	ids := []string{first.ID}
	if _, err := c.SetDraining(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		sb, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Hour}, TemplateID: "custom"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	if _, err := c.SetDraining(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return c.leading.Load() }, "the cluster to lead")
	if err := n1.Publish(ctx, &nodev1.Event{Kind: nodev1.Event_KIND_DRAINING}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, id := range ids {
			if sb, err := c.Get(ctx, id); err != nil || sb.NodeID != "n2" || !n2.IsRunning(id) {
				return false
			}
		}
		return true
	}, "every sandbox of the node going away to run on the other")
	for _, id := range ids {
		if sb, err := c.Get(ctx, id); err != nil || sb.State != StateRunning || sb.NodeID != "n2" || n1.IsRunning(id) {
			t.Fatalf("sandbox %s after the evacuation: %+v %v", id, sb, err)
		}
	}
	if got := n1.Exports(); got != len(ids) {
		t.Fatalf("%d snapshots exported for %d sandboxes", got, len(ids))
	}
	waitFor(t, func() bool { return n1.SnapshotCount() == 0 && n2.SnapshotCount() == 0 },
		"the migrations' snapshots to be deleted on both nodes")
}
