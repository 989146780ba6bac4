package membership

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// idNode is a node that only answers ID and Info, all a Reporter asks.
type idNode struct {
	nodeapi.Node
	id string
}

func (n idNode) ID() string { return n.id }
func (n idNode) Info(context.Context, *nodev1.InfoRequest) (*nodev1.NodeInfo, error) {
	return &nodev1.NodeInfo{Id: n.id}, nil
}

func register(ctx context.Context, st state.Store, id, addr, instance string) (*Registration, error) {
	return RegisterNode(ctx, st, InstanceReporter(idNode{id: id}, addr, instance), slog.New(slog.DiscardHandler))
}

// TestSecondInstanceRefused: a second process that claims a live node's
// id is refused, with the holder's address in the error, once the holder
// renews its record; a restart of the same instance takes the id at once.
func TestSecondInstanceRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := state.NewMemory()
	first, err := register(ctx, st, "n1", "10.0.0.1:8100", "aaaa@host1")
	if err != nil {
		t.Fatal(err)
	}
	defer first.Stop()
	start := time.Now()
	second, err := register(ctx, st, "n1", "10.0.0.2:8100", "bbbb@host2")
	if err == nil {
		second.Stop()
		t.Fatal("a second instance registered a live node's id")
	}
	if !errors.Is(err, ErrNodeIDTaken) || !strings.Contains(err.Error(), "10.0.0.1:8100") {
		t.Fatalf("second instance: %v, want ErrNodeIDTaken naming 10.0.0.1:8100", err)
	}
	if d := time.Since(start); d > claimWait {
		t.Fatalf("the refusal took %s, more than a lease and a report (%s)", d, claimWait)
	}
	start = time.Now()
	again, err := register(ctx, st, "n1", "10.0.0.1:8101", "aaaa@host1")
	if err != nil {
		t.Fatalf("a restart of the same instance: %v", err)
	}
	defer again.Stop()
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a restart of the same instance waited %s", d)
	}
}

// TestDeadHolderReleasesID: the record of an instance that stopped
// renewing (a crash) holds the id only until its lease ends.
func TestDeadHolderReleasesID(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := state.NewMemory()
	dead, err := register(ctx, st, "n2", "10.0.0.1:8100", "aaaa@host1")
	if err != nil {
		t.Fatal(err)
	}
	dead.Stop() // no more renewals; the lease runs out
	next, err := register(ctx, st, "n2", "10.0.0.3:8100", "cccc@host3")
	if err != nil {
		t.Fatalf("after the holder died: %v", err)
	}
	defer next.Stop()
	e, err := st.Get(ctx, LivePrefix+"n2")
	if err != nil || !strings.Contains(string(e.Value), "cccc@host3") {
		t.Fatalf("live record after the claim: %s, %v", e.Value, err)
	}
}

// TestNudgeReportsAtOnce: a nudge (a node's warm pool ran out or filled)
// brings its next report forward instead of leaving the cluster to read
// a stale pool for up to ReportInterval; nudges in a burst coalesce.
func TestNudgeReportsAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := state.NewMemory()
	var reports atomic.Int32
	inner := InstanceReporter(idNode{id: "n9"}, "10.0.0.9:8100", "aaaa@host9")
	reg, err := RegisterNode(ctx, st, func() NodeInfo { reports.Add(1); return inner() }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Stop()
	base := reports.Load()
	reg.Nudge()
	deadline := time.Now().Add(ReportInterval / 2)
	for reports.Load() == base && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if reports.Load() == base {
		t.Fatalf("no report within %v of a nudge", ReportInterval/2)
	}
	base = reports.Load()
	for range 50 {
		reg.Nudge()
		time.Sleep(time.Millisecond)
	}
	time.Sleep(time.Second)
	// Two for the nudges at most (one pending while another waits out
	// nudgeSpacing), and perhaps the interval's own.
	if got := reports.Load() - base; got < 1 || got > 3 {
		t.Errorf("50 nudges brought %d reports within a second, want 1 to 3 (coalesced)", got)
	}
}
