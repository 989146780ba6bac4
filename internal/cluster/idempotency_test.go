package cluster

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/state"
)

// TestIdempotencyKey: creates repeated with one Idempotency-Key make one
// sandbox, sequentially and concurrently; another API key's same header
// does not meet it; a failed create frees its key; an ended sandbox's key
// is a conflict, not a second sandbox.
func TestIdempotencyKey(t *testing.T) {
	ctx := context.Background()
	n := nodetest.NewFake("n1")
	c := openCluster(t, state.NewMemory(), n)
	defer c.Close(ctx, StopKill)
	req := func(owner, key string) CreateRequest {
		return CreateRequest{Spec: Spec{Timeout: time.Hour}, TemplateID: "base", IdempotencyKey: key, Owner: Owner{KeyID: owner}}
	}

	first, err := c.Create(ctx, req("alice", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Create(ctx, req("alice", "k1"))
	if err != nil || again.ID != first.ID {
		t.Fatalf("repeated create: %v, %v; want sandbox %s", again, err, first.ID)
	}

	var wg sync.WaitGroup
	ids := make([]string, 4)
	for i := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.Create(ctx, req("alice", "k2"))
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	for _, id := range ids {
		if id != ids[0] {
			t.Fatalf("concurrent creates with one key made %v", ids)
		}
	}

	other, err := c.Create(ctx, req("bob", "k1"))
	if err != nil || other.ID == first.ID {
		t.Fatalf("another API key's create with the same header: %v %v", other, err)
	}

	n.SetFull(true)
	if _, err := c.Create(ctx, req("alice", "k3")); err == nil {
		t.Fatal("a create on a full node succeeded")
	}
	n.SetFull(false)
	if _, err := c.Create(ctx, req("alice", "k3")); err != nil {
		t.Fatalf("the retry of a failed create: %v", err)
	}

	if err := c.Kill(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Create(ctx, req("alice", "k1")); !errors.Is(err, ErrIdempotencyConflict) {
		t.Fatalf("a create repeated after its sandbox was killed: %v, want ErrIdempotencyConflict", err)
	}
	running := n.Running()
	if running != 3 {
		t.Fatalf("%d sandboxes run; want 3 (k2, bob's k1, k3)", running)
	}
}
