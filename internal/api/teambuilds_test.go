package api_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/state"
)

// TestTeamBuilds: a team's builds past its quota wait for one to end;
// another team's do not; a wait ends with its context.
func TestTeamBuilds(t *testing.T) {
	ctx := context.Background()
	keys, err := apikeys.Open(ctx, state.NewMemory(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer keys.Close()
	if _, err := keys.CreateTeam(ctx, "alpha", apikeys.Quota{MaxBuilds: 1}); err != nil {
		t.Fatal(err)
	}
	limit := api.TeamBuilds(keys)
	release, err := limit(ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	if r, err := limit(ctx, "beta"); err != nil {
		t.Fatalf("another team's build: %v", err)
	} else {
		r()
	}
	got := make(chan time.Time)
	go func() {
		r, err := limit(ctx, "alpha")
		if err != nil {
			t.Error(err)
		}
		got <- time.Now()
		r()
	}()
	time.Sleep(100 * time.Millisecond)
	freed := time.Now()
	release()
	release() // twice is once
	if at := <-got; at.Before(freed) {
		t.Fatal("the second build of a team with one slot ran before the first ended")
	}
	hold, _ := limit(ctx, "alpha")
	defer hold()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := limit(short, "alpha"); err == nil {
		t.Fatal("a wait outlived its context")
	}
}
