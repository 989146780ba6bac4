package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/state"
)

func openTeamCluster(t *testing.T, st state.Store, n *nodetest.Fake, limits TeamLimits) *Cluster {
	t.Helper()
	c, err := Open(context.Background(), Config{State: st, Local: n, Candidate: fmt.Sprintf("server-%d", candidates.Add(1)),
		TickInterval: 20 * time.Millisecond, TeamLimits: func(team string) TeamLimits {
			if team == "alpha" {
				return limits
			}
			return TeamLimits{}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background(), StopKeep) })
	return c
}

var alpha = Owner{KeyID: "ka", Team: "alpha"}

func teamCreate(c *Cluster, o Owner) (*Sandbox, error) {
	return c.Create(context.Background(), CreateRequest{Spec: Spec{Timeout: time.Hour}, TemplateID: "base", Owner: o})
}

// slowSlots delays reads of the quota's reservations, so that racing
// starts all read them before any of them writes: only compare-and-swap
// keeps more than one from winning then.
type slowSlots struct{ state.Store }

func (s slowSlots) Get(ctx context.Context, key string) (state.Entry, error) {
	e, err := s.Store.Get(ctx, key)
	if strings.HasPrefix(key, slotsPrefix) {
		time.Sleep(10 * time.Millisecond)
	}
	return e, err
}

// TestTeamQuotaRace: two servers racing for a team's last slot never both
// win; a sandbox that stops running gives its slot back; other teams are
// not bounded by it.
func TestTeamQuotaRace(t *testing.T) {
	st := slowSlots{state.NewMemory()}
	// Starts take a while, as real ones do: the racers' reservations
	// overlap, and neither sees the other's record before it decides.
	n1, n2 := nodetest.NewFake("n1"), nodetest.NewFake("n2")
	n1.SetDelay(20 * time.Millisecond)
	n2.SetDelay(20 * time.Millisecond)
	a := openTeamCluster(t, st, n1, TeamLimits{MaxSandboxes: 1})
	b := openTeamCluster(t, st, n2, TeamLimits{MaxSandboxes: 1})
	for round := range 5 {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []*Sandbox
		for i := range 8 {
			c := a
			if i%2 == 1 {
				c = b
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := teamCreate(c, alpha)
				if err != nil && !errors.Is(err, ErrQuota) {
					t.Errorf("round %d: %v", round, err)
				}
				if err == nil {
					mu.Lock()
					won = append(won, sb)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(won) != 1 {
			t.Fatalf("round %d: %d creates won the last slot, want exactly 1", round, len(won))
		}
		// Another team is not bounded by alpha's quota.
		if _, err := teamCreate(b, Owner{KeyID: "kb", Team: "beta"}); err != nil {
			t.Fatalf("beta's create: %v", err)
		}
		// Killed on one server, the slot is free on the other at once.
		if err := a.Kill(context.Background(), won[0].ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTeamQuotaLifecycle: resumes and forks count against the team's
// running quota, pauses against its paused one, and a refusal names the
// limit and the count.
func TestTeamQuotaLifecycle(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	c := openTeamCluster(t, st, nodetest.NewFake("n1"), TeamLimits{MaxSandboxes: 2, MaxPaused: 1})
	one, err := teamCreate(c, alpha)
	if err != nil {
		t.Fatal(err)
	}
	two, err := teamCreate(c, alpha)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := teamCreate(c, alpha); !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "2 of its 2") {
		t.Fatalf("a third create: %v, want ErrQuota naming 2 of 2", err)
	}
	if _, err := c.Fork(ctx, one.ID, 1, time.Minute, alpha); !errors.Is(err, ErrQuota) {
		t.Fatalf("a fork past the quota: %v, want ErrQuota", err)
	}
	if err := c.Pause(ctx, one.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Pause(ctx, two.ID); !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "1 of its 1 paused") {
		t.Fatalf("a second pause: %v, want ErrQuota naming 1 of 1 paused", err)
	}
	three, err := teamCreate(c, alpha) // the paused one left a slot
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Connect(ctx, one.ID, time.Minute); !errors.Is(err, ErrQuota) {
		t.Fatalf("resuming past the quota: %v, want ErrQuota", err)
	}
	if sb, _ := c.Get(ctx, one.ID); sb.State != StatePaused || sb.SnapshotID == "" {
		t.Fatalf("a refused resume left %+v, want it paused as it was", sb)
	}
	if err := c.Kill(ctx, three.ID); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := c.Connect(ctx, one.ID, time.Minute); err != nil || !resumed {
		t.Fatalf("resuming with a slot free: %v %v", resumed, err)
	}
	if u := c.TeamUsage("alpha"); u.Running != 2 || u.Paused != 0 {
		t.Fatalf("usage %+v, want 2 running", u)
	}
}

// TestTeamVolumeQuota: a team's volumes may take as many bytes as its
// bound; names are the team's own.
func TestTeamVolumeQuota(t *testing.T) {
	ctx := context.Background()
	c := openTeamCluster(t, state.NewMemory(), nodetest.NewFake("n1"), TeamLimits{MaxVolumeBytes: 100 << 20})
	if _, err := c.CreateVolume(ctx, alpha, "a", 64<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVolume(ctx, alpha, "b", 64<<20); !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "67108864 of its 104857600") {
		t.Fatalf("a volume past the quota: %v, want ErrQuota naming the bytes", err)
	}
	if _, err := c.CreateVolume(ctx, alpha, "b", 32<<20); err != nil {
		t.Fatalf("the refused name is free again: %v", err)
	}
	beta := Owner{KeyID: "kb", Team: "beta"}
	if _, err := c.CreateVolume(ctx, beta, "a", 64<<20); err != nil {
		t.Fatalf("beta's volume of alpha's name: %v", err)
	}
	if vs, _ := c.ListVolumes(ctx, beta); len(vs) != 1 || vs[0].TeamID() != "beta" {
		t.Fatalf("beta lists %+v, want its one volume", vs)
	}
}

// TestKeyQuotaConcurrent: many creates of one API key at once (a batch)
// start no more sandboxes than its bound, since those under way count.
// Without them, every create passed the check before any was recorded.
func TestKeyQuotaConcurrent(t *testing.T) {
	n := nodetest.NewFake("n1")
	n.SetDelay(50 * time.Millisecond)
	c := openCluster(t, state.NewMemory(), n)
	owner := Owner{KeyID: "k1", Team: "k1", MaxSandboxes: 3}
	var wg sync.WaitGroup
	var made, refused atomic.Int32
	for range 10 {
		wg.Go(func() {
			_, err := c.Create(context.Background(), CreateRequest{Spec: Spec{Timeout: time.Hour}, TemplateID: "base", Owner: owner})
			switch {
			case err == nil:
				made.Add(1)
			case errors.Is(err, ErrQuota):
				refused.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if made.Load() != 3 || refused.Load() != 7 {
		t.Fatalf("10 creates at once under a bound of 3: %d made, %d refused", made.Load(), refused.Load())
	}
	// Once they run, the bound holds as before.
	if _, err := c.Create(context.Background(), CreateRequest{Spec: Spec{Timeout: time.Hour}, TemplateID: "base", Owner: owner}); !errors.Is(err, ErrQuota) {
		t.Fatalf("a fourth create: %v, want ErrQuota", err)
	}
}
