package server

import (
	"context"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/runtime/cgroups"
	"github.com/aenvhq/aenv/internal/runtime/gvisor"
)

// TestForkBombHostBound: the pids limit bounds what a sandbox takes of
// the host, not only its guest tasks. gVisor runs host threads of its own
// for guest processes (systrap: a stub process and its threads per
// address space, pooled and never freed), so a guest bounded at the limit
// used to take half as many host tasks again (1,551 at a limit of 1,024).
// Here the host tasks of the sandbox's cgroup, where every runsc process
// of it runs (sentry, gofer, stubs), stay within the limit plus runsc's
// own overhead while a fork bomb runs; the host keeps serving other
// sandboxes, and the bombed one can be killed.
func TestForkBombHostBound(t *testing.T) {
	const limit = 256
	srv, c, _ := startServerWith(t, func(cfg *Config) {
		cfg.WarmPoolMemory = -1
		cfg.PidsLimit = limit
	})
	ctx := context.Background()
	cg, err := cgroups.Open(cgroups.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bomb := mustCreate(t, c, client.CreateOptions{Timeout: 120})
	other := mustCreate(t, c, client.CreateOptions{Timeout: 120})
	name := "/" + srv.cfg.NetnsTag + "/" + bomb.SandboxID
	p, err := cg.Pids(name)
	if err != nil {
		t.Fatal(err)
	}
	if p.Max == 0 || p.Max > limit+gvisor.HostPidsOverhead {
		t.Fatalf("the sandbox's pids cgroup allows %d tasks (0: unbounded), want at most %d", p.Max, limit+gvisor.HostPidsOverhead)
	}
	idle := p.Current

	runOut(t, c, bomb.SandboxID, `nohup bash -c ':(){ :|:& };:' >/dev/null 2>&1 &`)
	var peak int64
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if p, err := cg.Pids(name); err == nil && p.Current > peak {
			peak = p.Current
		}
	}
	t.Logf("host tasks of the sandbox: %d idle, %d at the peak of the bomb (limit %d)", idle, peak, limit)
	if peak > limit+gvisor.HostPidsOverhead {
		t.Fatalf("the bombed sandbox took %d host tasks, want at most its limit %d plus %d", peak, limit, gvisor.HostPidsOverhead)
	}
	// Without this the bound above could pass by a bomb that never ran.
	if peak < limit/2 {
		t.Fatalf("the bomb reached only %d host tasks (idle %d): it did not run", peak, idle)
	}
	if got := runOut(t, c, other.SandboxID, "echo alive"); got != "alive" {
		t.Fatalf("the other sandbox during the bomb: %q", got)
	}
	start := time.Now()
	killCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Kill(killCtx, bomb.SandboxID); err != nil {
		t.Fatalf("killing the bombed sandbox: %v", err)
	}
	t.Logf("killed the bombed sandbox in %v", time.Since(start).Round(time.Millisecond))
	if p, err := cg.Pids(name); err == nil && p.Current > 0 {
		t.Fatalf("%d host tasks of the killed sandbox are left", p.Current)
	}
}
