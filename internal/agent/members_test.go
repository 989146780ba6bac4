package agent

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/state"
)

// etcdMembers is a Store with an etcd cluster's member list.
type etcdMembers struct {
	state.Store
	urls []string
}

func (e etcdMembers) MemberURLs(context.Context) ([]string, error) { return e.urls, nil }

func putNode(t *testing.T, st state.Store, id, addr string) {
	t.Helper()
	b, err := json.Marshal(membership.NodeInfo{ID: id, Address: addr, UpdatedAt: time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{membership.KnownPrefix + id, membership.LivePrefix + id} {
		if _, err := st.Put(context.Background(), k, b, state.WriteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestMemberWatch: the addresses of the members are there from the start,
// and follow the registry as nodes come and go.
func TestMemberWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := etcdMembers{Store: state.NewMemory(), urls: []string{"http://198.51.100.9:2379", "http://198.51.100.9:2380"}}
	putNode(t, st, "n1", "203.0.113.5:8100")
	w, first, err := openMemberWatch(ctx, st, []string{"unix:///run/aenv/etcd.sock"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if want := addrs("198.51.100.9", "203.0.113.5"); !slices.Equal(first, want) {
		t.Fatalf("first addresses %v, want %v", first, want)
	}
	sets := make(chan []netip.Addr, 8)
	w.run(ctx, first, func(as []netip.Addr) error { sets <- as; return nil })
	next := func(what string, want []netip.Addr) {
		t.Helper()
		select {
		case got := <-sets:
			if !slices.Equal(got, want) {
				t.Fatalf("%s: addresses %v, want %v", what, got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the addresses were not set again", what)
		}
	}
	putNode(t, st, "n2", "203.0.113.6:8100")
	next("a node joined", addrs("198.51.100.9", "203.0.113.5", "203.0.113.6"))
	if err := membership.RemoveNode(ctx, st, "n1", time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	next("a node removed", addrs("198.51.100.9", "203.0.113.6"))
	cancel()
	w.wait()
}
