package membership

import (
	"context"
	"errors"
	"testing"

	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

func keyring(t *testing.T, keys ...sealed.Key) *sealed.Keyring {
	t.Helper()
	kr, err := sealed.NewKeyring(keys, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// TestCheckDataKey: the first server records its key; a process with
// another key is refused, one that also holds the cluster's is not.
func TestCheckDataKey(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	k := sealed.NewKey()
	if err := CheckDataKey(ctx, st, keyring(t, k), false); !errors.Is(err, ErrWrongDataKey) {
		t.Fatalf("a node before any server: %v, want ErrWrongDataKey", err)
	}
	if err := CheckDataKey(ctx, st, keyring(t, k), true); err != nil {
		t.Fatal(err)
	}
	if err := CheckDataKey(ctx, st, keyring(t, sealed.NewKey()), true); !errors.Is(err, ErrWrongDataKey) {
		t.Fatalf("another key: %v, want ErrWrongDataKey", err)
	}
	if err := CheckDataKey(ctx, st, keyring(t, sealed.NewKey(), k), false); err != nil {
		t.Fatalf("keys holding the cluster's: %v", err)
	}
}
