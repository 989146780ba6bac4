package bench

import (
	"context"
	"strings"
	"sync"
	"testing"

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
	return map[string]float64{"go_goroutines": float64(100 + a.created), "process_open_fds": 50}, nil
}

func TestSoakReportsGrowth(t *testing.T) {
	api := &leakyAPI{}
	res, err := Soak(context.Background(), api, "base", 40, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	if api.created != 40 || api.killed != 40 || res.Failed != 0 {
		t.Fatalf("ran %d creates and %d kills (%d failed), want 40 each", api.created, api.killed, res.Failed)
	}
	var out strings.Builder
	res.WriteTable(&out)
	if !strings.Contains(out.String(), "goroutines") || !strings.Contains(out.String(), "+40.0%") || !strings.Contains(out.String(), "grew") {
		t.Fatalf("the table does not show the goroutines' growth:\n%s", out.String())
	}
	if strings.Count(out.String(), "grew") != 1 {
		t.Fatalf("only the goroutines grew:\n%s", out.String())
	}
}
