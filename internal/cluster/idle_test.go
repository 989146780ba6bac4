package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// TestIdlePause: a sandbox its node reports idle is paused by the leader
// and marked so; traffic resumes it (though it did not ask for
// autoResume) with the deadline it had; a report of a sandbox that no
// longer runs on that node is ignored; an idle-paused sandbox whose
// deadline passes is killed, or left paused as its owner's when it asked
// to pause on timeout.
func TestIdlePause(t *testing.T) {
	ctx := context.Background()
	n := nodetest.NewFake("n1")
	c := openCluster(t, state.NewMemory(), n)
	waitFor(t, c.Leading, "the cluster to lead")
	idle := func(id string) {
		t.Helper()
		if err := n.Publish(ctx, &nodev1.Event{Kind: nodev1.Event_KIND_IDLE, SandboxId: id, Reason: "idle: test"}); err != nil {
			t.Fatal(err)
		}
	}
	paused := func(id string) func() bool {
		return func() bool { sb, err := c.Get(ctx, id); return err == nil && sb.State == StatePaused }
	}

	sb := create(t, c, time.Hour)
	idle(sb.ID)
	waitFor(t, paused(sb.ID), "the idle sandbox to be paused")
	got, err := c.Get(ctx, sb.ID)
	if err != nil || !got.IdlePaused || got.AutoResume {
		t.Fatalf("after the idle pause: %+v, %v; want idle-paused, autoResume unset", got, err)
	}
	ok, err := c.AutoResume(ctx, sb.ID)
	if err != nil || !ok {
		t.Fatalf("traffic to an idle-paused sandbox: resumed %v, %v", ok, err)
	}
	got, err = c.Get(ctx, sb.ID)
	if err != nil || got.State != StateRunning || got.IdlePaused || got.EndAt.Sub(sb.EndAt).Abs() > time.Second {
		t.Fatalf("after the resume: %+v, %v; want running, not idle-paused, deadline %v", got, err, sb.EndAt)
	}

	// A user's own pause does not resume on traffic.
	if err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if ok, err := c.AutoResume(ctx, sb.ID); err != nil || ok {
		t.Fatalf("traffic to a sandbox its owner paused: resumed %v, %v", ok, err)
	}

	// Reported by a node it does not run on: left alone.
	other := create(t, c, time.Hour)
	c.nodeEvent("n2", &nodev1.Event{Kind: nodev1.Event_KIND_IDLE, SandboxId: other.ID})
	time.Sleep(200 * time.Millisecond)
	if got, _ := c.Get(ctx, other.ID); got == nil || got.State != StateRunning {
		t.Fatalf("a report from the wrong node paused %+v", got)
	}

	// Deadlines passing while idle-paused.
	kill, keep := create(t, c, time.Hour), create(t, c, time.Hour)
	if _, err := c.recs.mutate(ctx, keep.ID, func(r *record) error { r.AutoPause = true; return nil }); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{kill.ID, keep.ID} {
		idle(id)
		waitFor(t, paused(id), "the idle sandbox to be paused")
		if _, err := c.recs.mutate(ctx, id, func(r *record) error { r.EndAt = time.Now().Add(-time.Second); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, func() bool { _, err := c.Get(ctx, kill.ID); return errors.Is(err, ErrNotFound) },
		"the timed-out idle-paused sandbox to be killed")
	waitFor(t, func() bool { sb, err := c.Get(ctx, keep.ID); return err == nil && !sb.IdlePaused },
		"the timed-out idle-paused autoPause sandbox to become its owner's pause")
	if got, _ := c.Get(ctx, keep.ID); got.State != StatePaused {
		t.Fatalf("the autoPause sandbox after its deadline: %+v, want paused", got)
	}
	if ok, err := c.AutoResume(ctx, keep.ID); err != nil || ok {
		t.Fatalf("traffic to it after its deadline: resumed %v, %v", ok, err)
	}
}
