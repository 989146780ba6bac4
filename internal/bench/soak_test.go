package bench

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// leakyAPI stands in for a server whose goroutines grow with every
// sandbox, to check what the soak suite reports.
type leakyAPI struct {
	mu      sync.Mutex
	created int
	killed  int
}

func (a *leakyAPI) Create(ctx context.Context, opts client.CreateOptions) (*client.Sandbox, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.created++
	return &client.Sandbox{SandboxID: "sb"}, nil
}

func (a *leakyAPI) Run(ctx context.Context, id, cmd string, opts client.RunOptions) (int, error) {
	return 0, nil
}

func (a *leakyAPI) Kill(ctx context.Context, id string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.killed++
	return nil
}

func (a *leakyAPI) Metrics(ctx context.Context) (map[string]float64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// The heap grows by 4 KiB a sandbox: 4 MiB a thousand.
	return map[string]float64{"go_goroutines": float64(100 + a.created), "process_open_fds": 50,
		"go_gc_heap_live_bytes": float64(16<<20 + a.created*4<<10)}, nil
}

func TestSoakReportsGrowthPerRound(t *testing.T) {
	api := &leakyAPI{}
	res, err := Soak(context.Background(), api, "base", SoakOptions{Cycles: 40, Rounds: 3, Concurrency: 4, Settle: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if api.created != 120 || api.killed != 120 || len(res.Rounds) != 3 {
		t.Fatalf("ran %d creates and %d kills in %d rounds, want 120 each in 3", api.created, api.killed, len(res.Rounds))
	}
	for i, rd := range res.Rounds {
		if rd.Failed != 0 || rd.Cycles != 40 {
			t.Fatalf("round %d: %d of %d cycles failed", i+1, rd.Failed, rd.Cycles)
		}
		if got := rd.End["go_goroutines"]; got != float64(100+40*(i+1)) {
			t.Fatalf("round %d ended with %v goroutines, want %d", i+1, got, 100+40*(i+1))
		}
	}
	var out strings.Builder
	if err := res.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	table := out.String()
	// 40 cycles of 4 KiB: 0.16 MiB a round, 3.9 MiB per thousand cycles.
	if strings.Count(table, "+0.2 MiB") != 3 || strings.Count(table, "grew") != 3 {
		t.Fatalf("the table does not show the live heap's growth in each round:\n%s", table)
	}
	for _, want := range []string{"LIVE HEAP", "RSS", "start", "16.0 MiB", "16.5 MiB", "220"} {
		if !strings.Contains(table, want) {
			t.Fatalf("the table lacks %q:\n%s", want, table)
		}
	}
}
