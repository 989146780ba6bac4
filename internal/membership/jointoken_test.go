package membership

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// TestJoinTokens: a token is accepted until it expires or is revoked;
// a wrong secret, a malformed or unknown token is refused; the state
// holds no secret.
func TestJoinTokens(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	now := time.Now()
	tok, rec, err := CreateJoinToken(ctx, st, JoinTokenSpec{TTL: time.Hour, Description: "test"}, now)
	if err != nil {
		t.Fatal(err)
	}
	if !joinTokenPattern.MatchString(tok) || !strings.HasPrefix(tok, rec.ID+".") {
		t.Fatalf("token %q (id %s) is not of kubeadm's form", tok, rec.ID)
	}
	ents, _, _ := st.List(ctx, JoinTokenPrefix)
	if len(ents) != 1 || strings.Contains(string(ents[0].Value), strings.TrimPrefix(tok, rec.ID+".")) {
		t.Fatalf("stored: %s", ents[0].Value)
	}
	if _, err := CheckJoinToken(ctx, st, tok, JoinNode, now.Add(59*time.Minute)); err != nil {
		t.Fatalf("a valid token: %v", err)
	}
	// A node's token joins no server (a server's join is handed the CA's
	// key), and a server's no node.
	if _, err := CheckJoinToken(ctx, st, tok, JoinServer, now); !errors.Is(err, ErrJoinTokenRole) {
		t.Fatalf("a node's token for a server's join: %v, want ErrJoinTokenRole", err)
	}
	stok, srec, err := CreateJoinToken(ctx, st, JoinTokenSpec{Role: JoinServer}, now)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := CheckJoinToken(ctx, st, stok, JoinServer, now); err != nil || got.Role != JoinServer {
		t.Fatalf("a server's token for a server's join: %+v %v", got, err)
	}
	if _, err := CheckJoinToken(ctx, st, stok, JoinNode, now); !errors.Is(err, ErrJoinTokenRole) {
		t.Fatalf("a server's token for a node's join: %v, want ErrJoinTokenRole", err)
	}
	if err := RevokeJoinToken(ctx, st, srec.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := CreateJoinToken(ctx, st, JoinTokenSpec{Role: "admin"}, now); err == nil {
		t.Fatal("a token of an unknown role was made")
	}
	for name, c := range map[string]struct {
		tok string
		at  time.Time
	}{
		"expired":   {tok, now.Add(time.Hour)},
		"wrong":     {rec.ID + ".0123456789abcdef", now},
		"malformed": {"aenvct_0123456789abcdef0123", now},
		"unknown":   {"zzzzzz.0123456789abcdef", now},
	} {
		if _, err := CheckJoinToken(ctx, st, c.tok, JoinNode, c.at); !errors.Is(err, ErrInvalidJoinToken) {
			t.Errorf("%s token: %v, want ErrInvalidJoinToken", name, err)
		}
	}
	list, err := ListJoinTokens(ctx, st, now)
	if err != nil || len(list) != 1 || list[0].ID != rec.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	if err := RevokeJoinToken(ctx, st, rec.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := CheckJoinToken(ctx, st, tok, JoinNode, now); !errors.Is(err, ErrInvalidJoinToken) {
		t.Fatalf("a revoked token: %v, want ErrInvalidJoinToken", err)
	}
	if err := RevokeJoinToken(ctx, st, rec.ID); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("revoking again: %v, want ErrNotFound", err)
	}
	// Expired tokens leave the list, and the state.
	if _, _, err := CreateJoinToken(ctx, st, JoinTokenSpec{TTL: time.Minute}, now); err != nil {
		t.Fatal(err)
	}
	if list, _ := ListJoinTokens(ctx, st, now.Add(2*time.Minute)); len(list) != 0 {
		t.Fatalf("expired tokens listed: %+v", list)
	}
	if ents, _, _ := st.List(ctx, JoinTokenPrefix); len(ents) != 0 {
		t.Fatalf("expired tokens kept: %d", len(ents))
	}
}

// TestRemovals: a removed node's certificates issued until its removal
// are refused, later ones (a join again) are not; a removal made after
// the watch started is seen.
func TestRemovals(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	now := time.Now()
	if err := RemoveNode(ctx, st, "early", now); err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 1)
	r, err := WatchRemovals(ctx, st, func(id string) { seen <- id }, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	<-seen
	// Certificates carry whole seconds.
	sec := now.Truncate(time.Second)
	if !r.Refused("early", sec.Add(-time.Hour)) || !r.Refused("early", sec) || r.Refused("early", sec.Add(time.Second)) || r.Refused("other", sec) {
		t.Fatal("wrong refusals for a node removed before the watch")
	}
	if err := RemoveNode(ctx, st, "late", now); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-seen:
		if id != "late" {
			t.Fatalf("saw the removal of %s", id)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a removal after the watch began was not seen")
	}
	if !r.Refused("late", sec) {
		t.Fatal("the late removal's certificate is not refused")
	}
}

// TestLoadCA: the first server creates the CA and records it; a second
// server with another data directory gets the same CA (from the state,
// sealed with the data key); one whose files hold another CA is refused;
// one with another data key cannot open it.
func TestLoadCA(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	log := slog.New(slog.DiscardHandler)
	keys := keyring(t, sealed.NewKey())
	d1, d2 := t.TempDir(), t.TempDir()
	ca1, err := LoadCA(ctx, st, keys, d1, log)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(d1, "secrets", "ca.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: %v %v", fi, err)
	}
	e, _ := st.Get(ctx, CAKey)
	if strings.Contains(string(e.Value), "PRIVATE KEY") {
		t.Fatal("the CA key is stored in the clear")
	}
	ca2, err := LoadCA(ctx, st, keys, d2, log)
	if err != nil || ca2.Hash() != ca1.Hash() {
		t.Fatalf("second server: %v, hash %v want %s", err, ca2, ca1.Hash())
	}
	again, err := LoadCA(ctx, st, keys, d1, log)
	if err != nil || again.Hash() != ca1.Hash() {
		t.Fatalf("restart: %v", err)
	}
	other := t.TempDir()
	if _, err := LoadCA(ctx, state.NewMemory(), keys, other, log); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(ctx, st, keys, other, log); !errors.Is(err, ErrWrongCA) {
		t.Fatalf("another CA's files: %v, want ErrWrongCA", err)
	}
	if _, err := LoadCA(ctx, st, keyring(t, sealed.NewKey()), t.TempDir(), log); err == nil {
		t.Fatal("a server with another data key opened the CA")
	}
}

// TestUseJoinToken: a used token is gone, so the next check of it fails;
// of two uses one wins; restore puts it back for another try.
func TestUseJoinToken(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	now := time.Now()
	tok, rec, err := CreateJoinToken(ctx, st, JoinTokenSpec{Role: JoinServer}, now)
	if err != nil {
		t.Fatal(err)
	}
	restore, err := UseJoinToken(ctx, st, tok)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := UseJoinToken(ctx, st, rec.ID); !errors.Is(err, ErrInvalidJoinToken) {
		t.Fatalf("a second use: %v, want ErrInvalidJoinToken", err)
	}
	if _, err := CheckJoinToken(ctx, st, tok, JoinServer, now); !errors.Is(err, ErrInvalidJoinToken) {
		t.Fatalf("checking a used token: %v, want ErrInvalidJoinToken", err)
	}
	if err := restore(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := CheckJoinToken(ctx, st, tok, JoinServer, now); err != nil || got.ExpiresAt != rec.ExpiresAt {
		t.Fatalf("a restored token: %+v, %v; want it as it was", got, err)
	}
}
