package server

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// TestBatchCreate: a batch of sandboxes comes back one line per sandbox,
// each running; under a key's bound of 3, a batch of 5 makes 3 and says
// why the other 2 failed, and an atomic batch of 5 makes none (what it
// made is removed) and answers the bound's 429.
func TestBatchCreate(t *testing.T) {
	_, admin, _ := startServer(t)
	ctx := context.Background()
	opts := client.CreateOptions{TemplateID: "base", Timeout: 120, Metadata: map[string]string{"batch": "one"}}
	seen := map[string]bool{}
	made, err := admin.CreateBatch(ctx, opts, 6, func(r client.BatchResult) {
		if r.Err != nil {
			t.Errorf("sandbox %d of the batch: %v", r.Index, r.Err)
			return
		}
		if seen[r.Sandbox.SandboxID] {
			t.Errorf("sandbox %s came twice", r.Sandbox.SandboxID)
		}
		seen[r.Sandbox.SandboxID] = true
	})
	if err != nil || made != 6 || len(seen) != 6 {
		t.Fatalf("a batch of 6: %d made, %d seen, %v", made, len(seen), err)
	}
	for id := range seen {
		if out := runWithin(t, admin, id, "echo up", 30*time.Second); out != "up" {
			t.Fatalf("sandbox %s of the batch: %q", id, out)
		}
		if err := admin.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	k, err := admin.CreateKey(ctx, "rl", client.KeyOptions{MaxSandboxes: 3})
	if err != nil {
		t.Fatal(err)
	}
	rl := client.New(admin.URL(), k.Key)
	failures := 0
	made, err = rl.CreateBatch(ctx, opts, 5, func(r client.BatchResult) {
		var apiErr *client.APIError
		switch {
		case r.Err == nil:
		case errors.As(r.Err, &apiErr) && apiErr.Status == http.StatusTooManyRequests:
			failures++
		default:
			t.Errorf("sandbox %d: %v, want a 429 naming the bound", r.Index, r.Err)
		}
	})
	if err != nil || made != 3 || failures != 2 {
		t.Fatalf("a batch of 5 under a bound of 3: %d made, %d refused, %v", made, failures, err)
	}
	mine, err := rl.List(ctx)
	if err != nil || len(mine) != 3 {
		t.Fatalf("the key's sandboxes after the batch: %d, %v", len(mine), err)
	}
	for _, sb := range mine {
		if err := rl.Kill(ctx, sb.SandboxID); err != nil {
			t.Fatal(err)
		}
	}

	sbs, err := rl.CreateAtomic(ctx, opts, 5)
	var apiErr *client.APIError
	if err == nil || !errors.As(err, &apiErr) || apiErr.Status != http.StatusTooManyRequests || !strings.Contains(err.Error(), "removed") {
		t.Fatalf("an atomic batch of 5 under a bound of 3: %d sandboxes, %v; want a 429 that says what was removed", len(sbs), err)
	}
	left, err := rl.List(ctx)
	if err != nil || len(left) != 0 {
		t.Fatalf("an atomic batch that failed left %d sandboxes (%v)", len(left), err)
	}
	sbs, err = rl.CreateAtomic(ctx, opts, 3)
	if err != nil || len(sbs) != 3 {
		t.Fatalf("an atomic batch within the bound: %d, %v", len(sbs), err)
	}

	// Bad input is refused before anything starts.
	for _, n := range []int{0, 1001} {
		if _, err := admin.CreateBatch(ctx, opts, n, func(client.BatchResult) {}); !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest {
			t.Errorf("a batch of %d: %v, want 400", n, err)
		}
	}
}
