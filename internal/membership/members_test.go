package membership

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

func put(t *testing.T, key string, v any) state.Event {
	t.Helper()
	var b []byte
	if s, ok := v.(string); ok {
		b = []byte(s)
	} else {
		var err error
		if b, err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	return state.Event{Type: state.EventPut, Entry: state.Entry{Key: key, Value: b}}
}

func del(key string) state.Event {
	return state.Event{Type: state.EventDelete, Entry: state.Entry{Key: key}}
}

// TestMembersHosts: the hosts of live and known nodes, of servers and of
// etcd members are members; a removed node is not, until it registers
// again; a node's usage reports change nothing.
func TestMembersHosts(t *testing.T) {
	m := NewMembers()
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	steps := []struct {
		what    string
		ev      *state.Event
		etcd    []string
		changed bool
		want    []string
	}{
		{what: "a node registers (known, then live)",
			ev:      ptr(put(t, KnownPrefix+"n1", NodeInfo{ID: "n1", Address: "203.0.113.5:8100", UpdatedAt: t0})),
			changed: true, want: []string{"203.0.113.5"}},
		{what: "its live record",
			ev:      ptr(put(t, LivePrefix+"n1", NodeInfo{ID: "n1", Address: "203.0.113.5:8100", UpdatedAt: t0})),
			changed: false, want: []string{"203.0.113.5"}},
		{what: "a usage report",
			ev:      ptr(put(t, LivePrefix+"n1", NodeInfo{ID: "n1", Address: "203.0.113.5:8100", Sandboxes: 3, UpdatedAt: t0.Add(3 * time.Second)})),
			changed: false, want: []string{"203.0.113.5"}},
		{what: "a second node, by name",
			ev:      ptr(put(t, LivePrefix+"n2", NodeInfo{ID: "n2", Address: "Node2.Example.test:8100"})),
			changed: true, want: []string{"203.0.113.5", "node2.example.test"}},
		{what: "a server with its API and cluster listener",
			ev:      ptr(put(t, ServerPrefix+"s1", ServerInfo{Name: "s1", Addresses: []string{"198.51.100.1:8000", "198.51.100.1:8443", "[2001:db8::1]:8000"}})),
			changed: true, want: []string{"198.51.100.1", "2001:db8::1", "203.0.113.5", "node2.example.test"}},
		{what: "etcd's members (a unix socket has no host)",
			etcd:    []string{"http://198.51.100.9:2379", "http://198.51.100.9:2380", "unix:///run/aenv/etcd.sock"},
			changed: true, want: []string{"198.51.100.1", "198.51.100.9", "2001:db8::1", "203.0.113.5", "node2.example.test"}},
		{what: "n1's lease runs out: still known",
			ev:      ptr(del(LivePrefix + "n1")),
			changed: false, want: []string{"198.51.100.1", "198.51.100.9", "2001:db8::1", "203.0.113.5", "node2.example.test"}},
		{what: "n1 removed",
			ev:      ptr(put(t, RemovedPrefix+"n1", t0.Add(time.Minute).Format(time.RFC3339Nano))),
			changed: true, want: []string{"198.51.100.1", "198.51.100.9", "2001:db8::1", "node2.example.test"}},
		{what: "n1 joins again later, elsewhere",
			ev:      ptr(put(t, KnownPrefix+"n1", NodeInfo{ID: "n1", Address: "203.0.113.6:8100", UpdatedAt: t0.Add(time.Hour)})),
			changed: true, want: []string{"198.51.100.1", "198.51.100.9", "2001:db8::1", "203.0.113.6", "node2.example.test"}},
		{what: "the server stops",
			ev:      ptr(del(ServerPrefix + "s1")),
			changed: true, want: []string{"198.51.100.9", "203.0.113.6", "node2.example.test"}},
		{what: "n2 moves",
			ev:      ptr(put(t, LivePrefix+"n2", NodeInfo{ID: "n2", Address: "203.0.113.7:8100"})),
			changed: true, want: []string{"198.51.100.9", "203.0.113.6", "203.0.113.7"}},
		{what: "a key of another kind",
			ev:      ptr(put(t, DrainPrefix+"n2", "x")),
			changed: false, want: []string{"198.51.100.9", "203.0.113.6", "203.0.113.7"}},
	}
	for _, s := range steps {
		var changed bool
		if s.ev != nil {
			changed = m.Apply(*s.ev)
		} else {
			changed = m.SetEtcd(s.etcd)
		}
		if got := m.Hosts(); !slices.Equal(got, s.want) || changed != s.changed {
			t.Fatalf("%s: Hosts = %v (changed %v), want %v (changed %v)", s.what, got, changed, s.want, s.changed)
		}
	}
	// A watch that broke: the list read again replaces the prefix's
	// records, deletions missed included.
	if !m.Replace(LivePrefix, []state.Entry{put(t, LivePrefix+"n3", NodeInfo{Address: "203.0.113.8:1"}).Entry}) {
		t.Fatal("Replace reported no change")
	}
	if got, want := m.Hosts(), []string{"198.51.100.9", "203.0.113.6", "203.0.113.8"}; !slices.Equal(got, want) {
		t.Fatalf("after Replace: Hosts = %v, want %v", got, want)
	}
}

func ptr[T any](v T) *T { return &v }

// TestMembersAddrs: names are resolved, addresses taken as they are, and
// a name that stops resolving keeps its last addresses until it is no
// longer a member's.
func TestMembersAddrs(t *testing.T) {
	m := NewMembers()
	m.Apply(put(t, LivePrefix+"n1", NodeInfo{Address: "node1.test:8100"}))
	m.Apply(put(t, LivePrefix+"n2", NodeInfo{Address: "[::ffff:203.0.113.9]:8100"}))
	m.SetEtcd([]string{"http://etcd.test:2379"})
	answers := map[string][]netip.Addr{
		"node1.test": {netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")},
		"etcd.test":  {netip.MustParseAddr("203.0.113.1")},
	}
	var failing bool
	lookup := func(_ context.Context, h string) ([]netip.Addr, error) {
		if failing {
			return nil, errors.New("resolver down")
		}
		return answers[h], nil
	}
	want := []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("2001:db8::1")}
	got, err := m.Addrs(context.Background(), lookup)
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("Addrs = %v, %v; want %v", got, err, want)
	}
	failing = true
	if got, err := m.Addrs(context.Background(), lookup); err == nil || !slices.Equal(got, want) {
		t.Fatalf("with the resolver down: Addrs = %v, %v; want the last answers %v and an error", got, err, want)
	}
	m.Apply(del(LivePrefix + "n1"))
	m.SetEtcd(nil)
	want = []netip.Addr{netip.MustParseAddr("203.0.113.9")}
	if got, _ := m.Addrs(context.Background(), lookup); !slices.Equal(got, want) {
		t.Fatalf("after n1 and etcd went: Addrs = %v, want %v", got, want)
	}
	if len(m.resolved) != 0 {
		t.Fatalf("answers of hosts no longer members are kept: %v", m.resolved)
	}
}

func TestHostOf(t *testing.T) {
	for in, want := range map[string]string{
		"203.0.113.5:8100":          "203.0.113.5",
		"[2001:db8::1]:8443":        "2001:db8::1",
		"Node.Example:80":           "node.example",
		"https://10.0.0.1:8443/x":   "10.0.0.1",
		"http://[2001:db8::2]:2379": "2001:db8::2",
		"unix:///run/aenv/etcd":     "",
		"":                          "",
		"node.example":              "node.example",
	} {
		if got := HostOf(in); got != want {
			t.Errorf("HostOf(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestRegisterServer: a server's record is in the registry once
// RegisterServer returns, and gone once it stops (it does not wait out
// its lease).
func TestRegisterServer(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	info := ServerInfo{Name: "host:/var/lib/aenv", Addresses: []string{"203.0.113.5:8000", "203.0.113.5:8443"}}
	r, err := RegisterServer(ctx, st, info, slogDiscard())
	if err != nil {
		t.Fatal(err)
	}
	e, err := st.Get(ctx, ServerPrefix+info.Name)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMembers()
	m.Apply(state.Event{Type: state.EventPut, Entry: e})
	if got := m.Hosts(); !slices.Equal(got, []string{"203.0.113.5"}) {
		t.Fatalf("the server's record gives the hosts %v", got)
	}
	r.Stop()
	if _, err := st.Get(ctx, ServerPrefix+info.Name); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("the record of a stopped server: %v, want gone", err)
	}
}

func slogDiscard() *slog.Logger { return slog.New(slog.DiscardHandler) }
