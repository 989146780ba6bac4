package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/state"
)

// TestKilledTombstonesGoWithTheHistory: a killed sandbox's tombstone (whose
// its logs are) lasts as long as the nodes keep its history, not a day,
// and the sweep deletes it then, so that churn leaves no key per sandbox
// in the store.
func TestKilledTombstonesGoWithTheHistory(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	c := openCluster(t, st, nodetest.NewFake("n1"))
	sb := create(t, c, time.Hour)
	before := time.Now()
	if err := c.Kill(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e, err := st.Get(ctx, tombstoneKey(sb.ID))
	if err != nil {
		t.Fatalf("no tombstone of the killed sandbox: %v", err)
	}
	var ts tombstone
	if err := json.Unmarshal(e.Value, &ts); err != nil {
		t.Fatal(err)
	}
	ttl := ts.Until.Sub(ts.At)
	if ttl != node.DefaultEndedHistoryRetention || ts.At.Before(before.Add(-time.Second)) {
		t.Fatalf("the killed sandbox's tombstone %+v lasts %s, want %s", ts, ttl, node.DefaultEndedHistoryRetention)
	}
	if _, err := c.Get(ctx, sb.ID); !errors.As(err, new(*GoneError)) {
		t.Fatalf("Get of the killed sandbox: %v, want a GoneError (its team may read its logs)", err)
	}
	// An hour on: expired, swept.
	ts.At, ts.Until = ts.At.Add(-2*time.Hour), ts.Until.Add(-2*time.Hour)
	b, _ := json.Marshal(ts)
	if _, err := st.Put(ctx, tombstoneKey(sb.ID), b, state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.recs.whyGone(ctx, sb.ID); ok {
		t.Fatal("an expired tombstone still answers")
	}
	c.sweepTombstones(ctx)
	if _, err := st.Get(ctx, tombstoneKey(sb.ID)); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("the expired tombstone after the sweep: %v, want it gone", err)
	}
	// One from before Until: a day from At, as it was.
	old, _ := json.Marshal(tombstone{Reason: "sandbox lost", At: time.Now().Add(-2 * time.Hour)})
	if _, err := st.Put(ctx, tombstoneKey("sb-old"), old, state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.sweepTombstones(ctx)
	if _, ok := c.recs.whyGone(ctx, "sb-old"); !ok {
		t.Fatal("a tombstone without Until, two hours old, is gone; want it kept a day")
	}
}
