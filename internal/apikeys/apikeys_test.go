package apikeys

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
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
	a, b := openTwo(t, st)

	key, k, err := a.Create(ctx, KeyOptions{Name: "trainer", MaxSandboxes: 5})
	if err != nil {
		t.Fatal(err)
	}
	if !ValidKey(key) || k.MaxSandboxes != 5 || k.Admin || !strings.HasPrefix(key, strings.TrimSuffix(k.Hint, "...")) || k.Team != k.ID {
		t.Fatalf("created %q: %+v (want a team of its own)", key, k)
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
	if _, _, err := a.Create(ctx, KeyOptions{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a key without a name: %v, want ErrInvalid", err)
	}

	// A server's own key, once revoked, stays revoked at its next start.
	if err := a.Revoke(ctx, k1.ID); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := b.Lookup(own); return !ok }, "the revoked server key to be refused")
	if _, err := b.Ensure(ctx, own, "server a restarted"); !errors.Is(err, ErrRevoked) {
		t.Fatalf("ensuring a revoked server key: %v, want ErrRevoked", err)
	}
	if _, ok := b.Lookup(own); ok {
		t.Fatal("the revoked server key was added again")
	}
}

// TestTeams: keys join named teams (made on first use), a key without one
// gets its own, quotas change by compare-and-swap and reach every server,
// and keys from before teams are teams of their own.
func TestTeams(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	a, b := openTwo(t, st)
	_, k1, err := a.Create(ctx, KeyOptions{Name: "one", Team: "beta"})
	if err != nil || k1.Team != "beta" {
		t.Fatalf("key in team beta: %+v %v", k1, err)
	}
	_, k2, err := a.Create(ctx, KeyOptions{Name: "two", Team: "beta"})
	if err != nil || k2.Team != "beta" {
		t.Fatalf("second key in team beta: %+v %v", k2, err)
	}
	if _, err := a.CreateTeam(ctx, "beta", Quota{}); !errors.Is(err, ErrTeamExists) {
		t.Fatalf("creating beta again: %v, want ErrTeamExists", err)
	}
	if _, err := a.CreateTeam(ctx, "Bad Name", Quota{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a malformed team id: %v, want ErrInvalid", err)
	}
	if _, err := a.SetQuota(ctx, "beta", func(q *Quota) { q.MaxSandboxes = -1 }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a negative quota: %v, want ErrInvalid", err)
	}
	if _, err := a.SetQuota(ctx, "beta", func(q *Quota) { q.MaxSandboxes, q.MaxPaused = 3, 2 }); err != nil {
		t.Fatal(err)
	}
	if _, err := b.SetQuota(ctx, "beta", func(q *Quota) { q.MaxBuilds = 1 }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		q, ok := a.Team("beta")
		return ok && q.MaxSandboxes == 3 && q.MaxPaused == 2 && q.MaxBuilds == 1
	}, "both quota changes to hold on the first server")
	if _, err := a.SetQuota(ctx, "nosuch", func(q *Quota) {}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a quota of no team: %v, want ErrNotFound", err)
	}

	// A key stored before teams existed.
	old := Key{ID: "k0123456789a", Name: "old", SHA256: strings.Repeat("0", 64), CreatedAt: time.Now()}
	bs, _ := json.Marshal(old)
	if _, err := st.Create(ctx, prefix+old.ID, bs, state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, ok := b.Team(old.ID); return ok }, "the old key's team of its own")
	ids := []string{}
	for _, tm := range b.Teams() {
		ids = append(ids, tm.ID)
	}
	if !slices.Contains(ids, "beta") || !slices.Contains(ids, old.ID) {
		t.Fatalf("teams %v: want beta and the old key's own", ids)
	}
}

// openTwo opens two servers' views of the keys in st.
func openTwo(t *testing.T, st state.Store) (*Keys, *Keys) {
	t.Helper()
	var out [2]*Keys
	for i := range out {
		s, err := Open(context.Background(), st, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		out[i] = s
	}
	return out[0], out[1]
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
