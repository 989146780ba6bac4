package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/membership"
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

// TestRecordsSealTokens: the tokens of sandbox and volume records are
// stored sealed, and read back in clear.
func TestRecordsSealTokens(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	kr := keyring(t, sealed.NewKey())
	rs := newRecords(st, kr)
	r := record{Sandbox: Sandbox{ID: "sb1", State: StateRunning, EnvdAccessToken: "envd-secret-1", TrafficAccessToken: "traffic-secret-1"}}
	if err := rs.create(ctx, r); err != nil {
		t.Fatal(err)
	}
	e, err := st.Get(ctx, sandboxKey("sb1"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(e.Value), "secret-1") {
		t.Fatalf("stored record holds a token in clear: %s", e.Value)
	}
	got, _, err := newRecords(st, kr).fetch(ctx, "sb1")
	if err != nil || got.EnvdAccessToken != "envd-secret-1" || got.TrafficAccessToken != "traffic-secret-1" {
		t.Fatalf("read back: %+v %v", got.Sandbox, err)
	}
	// Without the key the record does not read, rather than reading
	// with its tokens garbled.
	if _, _, err := newRecords(st, keyring(t, sealed.NewKey())).fetch(ctx, "sb1"); !errors.Is(err, sealed.ErrUnknownKey) {
		t.Fatalf("read with another key: %v, want ErrUnknownKey", err)
	}
	// A token sealed for one record does not open in another.
	var raw map[string]any
	json.Unmarshal(e.Value, &raw)
	raw["id"] = "sb2"
	b, _ := json.Marshal(raw)
	st.Put(ctx, sandboxKey("sb2"), b, state.WriteOptions{})
	if _, _, err := rs.fetch(ctx, "sb2"); !errors.Is(err, sealed.ErrCorrupt) {
		t.Fatalf("a token moved to another record opened: %v", err)
	}
	st.Delete(ctx, sandboxKey("sb2"), 0)

	v := &Volume{ID: "v1", Name: "data", Token: "volume-secret-1"}
	vb, _ := encodeVolume(kr, v)
	if strings.Contains(string(vb), "secret-1") {
		t.Fatalf("stored volume holds its token in clear: %s", vb)
	}
	if back, err := decodeVolume(kr, vb); err != nil || back.Token != "volume-secret-1" {
		t.Fatalf("volume read back: %+v %v", back, err)
	}
}

// TestResealState: after a rotation every stored secret is sealed with
// the new key (also those stored in clear before sealing), the cluster
// CA's key included, and the new key alone opens them all.
func TestResealState(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	old, next := sealed.NewKey(), sealed.NewKey()
	rs := newRecords(st, keyring(t, old))
	if err := membership.CheckDataKey(ctx, st, keyring(t, old), true); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if err := rs.create(ctx, record{Sandbox: Sandbox{ID: id, EnvdAccessToken: "tok-" + id}}); err != nil {
			t.Fatal(err)
		}
	}
	plain, _ := json.Marshal(record{Sandbox: Sandbox{ID: "c", EnvdAccessToken: "tok-c"}})
	st.Put(ctx, sandboxKey("c"), plain, state.WriteOptions{})
	vb, _ := encodeVolume(keyring(t, old), &Volume{ID: "v", Token: "tok-v"})
	st.Put(ctx, volumePrefix+"v", vb, state.WriteOptions{})
	ca, err := membership.LoadCA(ctx, st, keyring(t, old), t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}

	n, err := ResealState(ctx, st, keyring(t, next, old))
	if err != nil || n.Sandboxes != 3 || n.Volumes != 1 || n.CA != 1 {
		t.Fatalf("reseal: %+v %v", n, err)
	}
	only := keyring(t, next)
	for _, id := range []string{"a", "b", "c"} {
		r, _, err := newRecords(st, only).fetch(ctx, id)
		if err != nil || r.EnvdAccessToken != "tok-"+id {
			t.Fatalf("record %s with the new key alone: %+v %v", id, r.Sandbox, err)
		}
	}
	e, _ := st.Get(ctx, volumePrefix+"v")
	if v, err := decodeVolume(only, e.Value); err != nil || v.Token != "tok-v" {
		t.Fatalf("volume with the new key alone: %v", err)
	}
	if err := membership.CheckDataKey(ctx, st, only, false); err != nil {
		t.Fatalf("check with the new key alone: %v", err)
	}
	// A server with the new key alone and no CA files of its own takes
	// the cluster's CA from the state.
	back, err := membership.LoadCA(ctx, st, only, t.TempDir(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil || back.Hash() != ca.Hash() {
		t.Fatalf("the CA with the new key alone: %v", err)
	}
}
