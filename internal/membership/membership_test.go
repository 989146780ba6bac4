package membership

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// TestCheckToken: without a recorded token only a server (adopt) gets
// in, and records its own; after that any other token is refused, the
// same one accepted.
func TestCheckToken(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	if err := CheckToken(ctx, st, "node-token-0123456789", false); !errors.Is(err, ErrWrongToken) {
		t.Fatalf("a node before any server: %v, want ErrWrongToken", err)
	}
	if err := CheckToken(ctx, st, "server-token-0123456789", true); err != nil {
		t.Fatal(err)
	}
	if err := CheckToken(ctx, st, "other-token-0123456789", true); !errors.Is(err, ErrWrongToken) {
		t.Fatalf("another token: %v, want ErrWrongToken", err)
	}
	if err := CheckToken(ctx, st, "server-token-0123456789", false); err != nil {
		t.Fatalf("the cluster's token: %v", err)
	}
}

// TestStoppingMark: ClearStopping removes the mark MarkStopping left, and
// leaves an operator's drain alone.
func TestStoppingMark(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	if err := MarkStopping(ctx, st, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, DrainPrefix+"n1"); err != nil {
		t.Fatalf("the mark of a node stopping: %v", err)
	}
	if err := ClearStopping(ctx, st, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, DrainPrefix+"n1"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("mark after ClearStopping: %v, want gone", err)
	}
	st.Put(ctx, DrainPrefix+"n2", []byte(time.Now().UTC().Format(time.RFC3339)), state.WriteOptions{})
	if err := ClearStopping(ctx, st, "n2"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Get(ctx, DrainPrefix+"n2"); err != nil {
		t.Fatalf("an operator's drain after ClearStopping: %v, want kept", err)
	}
	if err := ClearStopping(ctx, st, "never"); err != nil {
		t.Fatalf("a node without a mark: %v", err)
	}
}
