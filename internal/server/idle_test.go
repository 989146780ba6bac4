package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/node"
)

// TestIdleSandboxPauses: with an idle period, a sandbox that has neither
// traffic nor CPU to speak of is paused by the platform in real gVisor
// (so nothing of its own keeps its packet count moving), while one that
// computes without traffic is not; the next command resumes the paused
// one with its processes and its deadline.
func TestIdleSandboxPauses(t *testing.T) {
	_, c, _ := startServerWith(t, func(cfg *Config) { cfg.Idle = node.IdlePolicy{After: 3 * time.Second} })
	ctx := context.Background()
	quiet, err := c.Create(ctx, client.CreateOptions{Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := c.Create(ctx, client.CreateOptions{Timeout: 300})
	if err != nil {
		t.Fatal(err)
	}
	before, err := c.Get(ctx, quiet.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	pid := runOut(t, c, quiet.SandboxID, "nohup sleep 1000 >/dev/null 2>&1 & echo $!")
	runOut(t, c, busy.SandboxID, "nohup sh -c 'while :; do :; done' >/dev/null 2>&1 &")

	state := func(id string) string {
		sb, err := c.Get(ctx, id)
		if err != nil {
			t.Fatalf("getting %s: %v", id, err)
		}
		return sb.State
	}
	deadline := time.Now().Add(30 * time.Second)
	for state(quiet.SandboxID) != "paused" {
		if time.Now().After(deadline) {
			t.Fatalf("the quiet sandbox still %s 30 s on, with a 3 s idle period", state(quiet.SandboxID))
		}
		time.Sleep(250 * time.Millisecond)
	}
	if s := state(busy.SandboxID); s != "running" {
		t.Fatalf("the sandbox that computes is %s, want running", s)
	}
	if sb, err := c.Get(ctx, quiet.SandboxID); err != nil || !sb.IdlePaused {
		t.Fatalf("the quiet sandbox's description: %+v, %v; want idlePaused", sb, err)
	}
	if n := procsLeft(quiet.SandboxID, 10*time.Second); n != 0 {
		t.Fatalf("the idle-paused sandbox still has %d host processes", n)
	}

	if out := runOut(t, c, quiet.SandboxID, "kill -0 "+pid+" && echo alive"); !strings.Contains(out, "alive") {
		t.Fatalf("after the resume: %q, want its sleep alive", out)
	}
	sb, err := c.Get(ctx, quiet.SandboxID)
	if err != nil || sb.State != "running" || sb.IdlePaused {
		t.Fatalf("after a command: %+v, %v; want running, not idlePaused", sb, err)
	}
	if d := sb.EndAt.Sub(before.EndAt).Abs(); d > 2*time.Second {
		t.Fatalf("the idle pause moved the deadline by %s (%v, was %v)", d, sb.EndAt, before.EndAt)
	}
}
