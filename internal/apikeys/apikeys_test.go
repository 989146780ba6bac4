package apikeys

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// TestKeysAcrossServers: two servers on one store accept the keys either
// creates, a revoked key is refused by both, only hashes are stored, and a
// server's own key is added once however often it starts.
func TestKeysAcrossServers(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	log := slog.New(slog.DiscardHandler)
	a, err := Open(ctx, st, log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(ctx, st, log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()

	key, k, err := a.Create(ctx, "trainer", 5, false)
	if err != nil {
		t.Fatal(err)
	}
	if !ValidKey(key) || k.MaxSandboxes != 5 || k.Admin || !strings.HasPrefix(key, strings.TrimSuffix(k.Hint, "...")) {
		t.Fatalf("created %q: %+v", key, k)
	}
	waitFor(t, func() bool { _, ok := b.Lookup(key); return ok }, "the other server to accept the new key")
	entries, _, _ := st.List(ctx, prefix)
	for _, e := range entries {
		if strings.Contains(string(e.Value), key) {
			t.Fatal("the key itself is in the store")
		}
	}
	if _, ok := a.Lookup("e2b_0123"); ok {
		t.Fatal("an unknown key was accepted")
	}
	if _, ok := a.Lookup("not-a-key"); ok {
		t.Fatal("a malformed key was accepted")
	}

	own := "e2b_" + strings.Repeat("ab", 20)
	k1, err := a.Ensure(ctx, own, "server a")
	if err != nil || !k1.Admin {
		t.Fatalf("ensuring the server's key: %+v %v", k1, err)
	}
	if k2, err := b.Ensure(ctx, own, "server a again"); err != nil || k2.ID != k1.ID {
		t.Fatalf("ensuring it again: %+v %v", k2, err)
	}
	if n := len(a.List()); n != 2 {
		t.Fatalf("%d keys listed, want 2", n)
	}
	for _, l := range a.List() {
		if l.SHA256 != "" {
			t.Fatal("List shows hashes")
		}
	}

	if err := b.Revoke(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := a.Lookup(key); return !ok }, "the revoked key to be refused everywhere")
	if err := b.Revoke(ctx, k.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoking twice: %v, want ErrNotFound", err)
	}
	if _, _, err := a.Create(ctx, "", 0, false); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a key without a name: %v, want ErrInvalid", err)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
