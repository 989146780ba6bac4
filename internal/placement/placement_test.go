package placement

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/capacity"
)

// node is a ready node of 4 GiB and 2 CPUs at the default overcommit
// (16 GiB may be committed), holding base, running gvisor 1.
func node(id string, committedMB int) *Node {
	return &Node{ID: id, Rule: capacity.Rule{MemoryMB: 4096, CPUCount: 2}, Load: capacity.Load{CommittedMB: committedMB, MemoryUsed: 0.2, DiskUsed: -1},
		Runtime: "gvisor", RuntimeVersion: "1", Templates: []string{"base"}}
}

func ids(nodes []*Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.ID)
	}
	slices.Sort(out)
	return out
}

// TestFilter: each constraint keeps exactly the nodes it should.
func TestFilter(t *testing.T) {
	drained := node("drained", 0)
	drained.Draining = true
	other := node("other", 0)
	other.Templates = nil
	oldRuntime := node("old", 0)
	oldRuntime.RuntimeVersion = "0"
	hot := node("hot", 0)
	hot.Load.MemoryUsed = 0.95
	diskFull := node("disk", 0)
	diskFull.Load.DiskUsed = 0.99
	full := node("full", 16384-256) // 256 MiB left
	nodes := []*Node{node("a", 0), node("b", 8192), drained, other, oldRuntime, hot, diskFull, full}

	for _, tc := range []struct {
		name string
		req  Request
		want []string
	}{
		{"holders of the template only", Request{Template: "base"}, []string{"a", "b", "old"}},
		{"any node without a template", Request{}, []string{"a", "b", "old", "other"}},
		{"any node when none holds it", Request{Template: "fresh"}, []string{"a", "b", "old", "other"}},
		{"a small sandbox fits the nearly full node", Request{MemoryMB: 256}, []string{"a", "b", "full", "old", "other"}},
		{"the default memory does not", Request{MemoryMB: 0}, []string{"a", "b", "old", "other"}},
		{"only", Request{Only: "b"}, []string{"b"}},
		{"exclude", Request{Template: "base", Exclude: []string{"a", "old"}}, []string{"b"}},
		{"runtime and version", Request{Runtime: "gvisor", RuntimeVersion: "0"}, []string{"old"}},
		{"a version an unstamped runsc saved: any of the runtime", Request{Runtime: "gvisor", RuntimeVersion: "VERSION_MISSING"}, []string{"a", "b", "old", "other"}},
		{"the other holders are excluded: any node", Request{Template: "base", Exclude: []string{"a", "b", "old"}}, []string{"other"}},
		{"the rest of the overcommit", Request{MemoryMB: 4096}, []string{"a", "b", "old", "other"}},
		{"the rest of a busy node's room", Request{MemoryMB: 4096, Only: "b"}, []string{"b"}},
	} {
		fits, err := Filter(tc.req, nodes)
		if err != nil || !slices.Equal(ids(fits), tc.want) {
			t.Errorf("%s: Filter = %v, %v; want %v", tc.name, ids(fits), err, tc.want)
		}
	}
}

// TestFilterRefusals: when no node may take the sandbox the refusal's
// kind, cause and reason say why.
func TestFilterRefusals(t *testing.T) {
	drained := node("drained", 0)
	drained.Draining = true
	hot := node("hot", 0)
	hot.Load.MemoryUsed = 0.95
	full := node("full", 16384)
	small := node("small", 0)
	small.Rule.CPUCount = 1

	for _, tc := range []struct {
		name  string
		req   Request
		nodes []*Node
		kind  error
		cause Cause
		says  string
	}{
		{"no node", Request{}, nil, ErrNoCapacity, CauseNoNode, "no node is ready"},
		{"every node draining", Request{}, []*Node{drained, drained}, ErrNoCapacity, CauseDraining, "every node is draining (2)"},
		{"the only node draining", Request{Only: "drained"}, []*Node{node("a", 0), drained}, ErrNoCapacity, CauseDraining, "node drained is draining"},
		{"the only node unknown", Request{Only: "nosuch"}, []*Node{node("a", 0)}, ErrNoCapacity, CauseNoNode, "no node is ready"},
		{"no runtime", Request{Runtime: "gvisor", RuntimeVersion: "2"}, []*Node{node("a", 0)}, ErrNoCapacity, CauseRuntime, "no ready node runs gvisor 2"},
		{"larger than every node's memory", Request{MemoryMB: 8192}, []*Node{node("a", 0), small}, ErrTooLarge, CauseTooLarge,
			"the sandbox (8192 MiB, 0 CPUs) is larger than every node (the largest has 4096 MiB, 2 CPUs)"},
		{"more CPUs than every node", Request{CPUs: 4}, []*Node{small}, ErrTooLarge, CauseTooLarge, "larger than every node"},
		{"full", Request{}, []*Node{full}, ErrNoCapacity, CauseNoRoom, "no node has room for 512 MiB more (1 full, 0 above their memory high-water mark; node full has 16384 of 16384 MiB committed)"},
		{"hot", Request{}, []*Node{hot}, ErrNoCapacity, CauseNoRoom, "0 full, 1 above their memory high-water mark; node hot's host memory is 95% used"},
		{"too large here, full there", Request{CPUs: 2}, []*Node{small, full}, ErrNoCapacity, CauseNoRoom, "1 full"},
		{"excluded", Request{Exclude: []string{"a"}}, []*Node{node("a", 0)}, ErrNoCapacity, CauseNoNode, "no node is ready"},
	} {
		fits, err := Filter(tc.req, tc.nodes)
		var r *Refusal
		if fits != nil || !errors.As(err, &r) || !errors.Is(err, tc.kind) || r.Cause != tc.cause || !strings.Contains(r.Reason, tc.says) {
			t.Errorf("%s: Filter = %v, %v (cause %q); want %v (%s) saying %q", tc.name, ids(fits), err, causeOf(r), tc.kind, tc.cause, tc.says)
		}
	}
}

func causeOf(r *Refusal) Cause {
	if r == nil {
		return ""
	}
	return r.Cause
}

// TestAdmissionDefaults: a node that reports no fractions is held to the
// rule's defaults, as its own admission holds it.
func TestAdmissionDefaults(t *testing.T) {
	n := &Node{ID: "n", Rule: capacity.Rule{MemoryMB: 1024, CPUCount: 1}, Load: capacity.Load{CommittedMB: 4096 - 512}}
	if fits, err := Filter(Request{}, []*Node{n}); len(fits) != 1 {
		t.Fatalf("the last 512 MiB of 4x overcommit: %v", err)
	}
	n.Load.CommittedMB++
	if _, err := Filter(Request{}, []*Node{n}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("past 4x overcommit: %v, want ErrNoCapacity", err)
	}
	n.Load = capacity.Load{MemoryUsed: 0.91}
	if _, err := Filter(Request{}, []*Node{n}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("above the default high-water mark of 0.9: %v, want ErrNoCapacity", err)
	}
	n.Rule.MemoryHighWater = 0.95
	if fits, _ := Filter(Request{}, []*Node{n}); len(fits) != 1 {
		t.Fatal("a node's own high-water mark is not applied")
	}
}

func TestHeadroom(t *testing.T) {
	if h := Headroom(Request{}, node("a", 1000)); h != 16384-1000-512 {
		t.Errorf("headroom of 1000 MiB committed of 16 GiB, placing the default 512 MiB: %d", h)
	}
	if h := Headroom(Request{MemoryMB: 2048}, node("a", 16384)); h != -2048 {
		t.Errorf("headroom of a full node: %d", h)
	}
}

// TestPreferred: the preferred node is taken when it may take the
// sandbox, whatever the others' headroom.
func TestPreferred(t *testing.T) {
	b := NewBestOfK(DefaultK, rand.New(rand.NewPCG(1, 2)))
	nodes := []*Node{node("empty", 0), node("busy", 12000)}
	for range 20 {
		if n, err := b.Place(Request{Prefer: "busy"}, nodes); err != nil || n.ID != "busy" {
			t.Fatalf("preferred busy: %v, %v", n, err)
		}
	}
	full := node("full", 16384)
	if n, err := b.Place(Request{Prefer: "full"}, []*Node{full, node("a", 0)}); err != nil || n.ID != "a" {
		t.Fatalf("a preferred node that is full: %v, %v; want a", n, err)
	}
	nobase := node("nobase", 0)
	nobase.Templates = nil
	if n, err := b.Place(Request{Prefer: "nobase", Template: "base"}, []*Node{nobase, node("a", 0)}); err != nil || n.ID != "a" {
		t.Fatalf("a preferred node without the template others hold: %v, %v; want a", n, err)
	}
}

// TestWarm: among the nodes that may take a sandbox, those with one of
// its pool key prestarted win over emptier ones without, a preferred node
// still comes first, and a warm node that cannot take it is not chosen.
func TestWarm(t *testing.T) {
	b := NewBestOfK(DefaultK, rand.New(rand.NewPCG(3, 4)))
	warm := node("warm", 12000)
	warm.Pooled = map[string]int{"t/base": 2, "s/snap": 0}
	other := node("other", 8000)
	other.Pooled = map[string]int{"t/code": 1}
	nodes := []*Node{node("empty1", 0), warm, node("empty2", 0), other}
	for range 50 {
		if n, err := b.Place(Request{Template: "base", Pool: "t/base"}, slices.Clone(nodes)); err != nil || n.ID != "warm" {
			t.Fatalf("a create of base: placed on %v, %v; want the node with base prestarted", n, err)
		}
		if n, err := b.Place(Request{Template: "base", Pool: "t/code"}, slices.Clone(nodes)); err != nil || n.ID != "other" {
			t.Fatalf("a create of code: placed on %v, %v; want other", n, err)
		}
		if n, err := b.Place(Request{Template: "base", Pool: "t/base", Prefer: "empty2"}, slices.Clone(nodes)); err != nil || n.ID != "empty2" {
			t.Fatalf("a create of base preferring empty2: placed on %v, %v", n, err)
		}
		// None prestarted: any of them, by headroom, as without a pool.
		if _, err := b.Place(Request{Template: "base", Pool: "s/snap"}, slices.Clone(nodes)); err != nil {
			t.Fatalf("a create of a key nobody holds: %v", err)
		}
	}
	// A restore goes where a prepared sandbox of its template is, unless
	// a node holds one prestarted of what it starts from.
	prepared := node("prepared", 8000)
	prepared.Pooled = map[string]int{"r/base": 1}
	withPrepared := []*Node{node("empty1", 0), prepared, warm}
	for range 50 {
		if n, err := b.Place(Request{Template: "base", Prepared: "r/base"}, slices.Clone(withPrepared)); err != nil || n.ID != "prepared" {
			t.Fatalf("a restore of base: placed on %v, %v; want the node with base prepared", n, err)
		}
		if n, err := b.Place(Request{Template: "base", Pool: "t/base", Prepared: "r/base"}, slices.Clone(withPrepared)); err != nil || n.ID != "warm" {
			t.Fatalf("a create of base that a prepared sandbox could serve too: placed on %v, %v; want the node with base prestarted", n, err)
		}
		if _, err := b.Place(Request{Template: "base", Prepared: "r/code"}, slices.Clone(withPrepared)); err != nil {
			t.Fatalf("a restore of a template nobody prepared: %v", err)
		}
	}
	// A prepared sandbox holds none of the restore's memory: a full node
	// with one does not take it.
	fullPrepared := node("full-prepared", 16384)
	fullPrepared.Pooled = map[string]int{"r/base": 3}
	if n, err := b.Place(Request{Template: "base", Prepared: "r/base"}, []*Node{fullPrepared, node("a", 0)}); err != nil || n.ID != "a" {
		t.Fatalf("a restore of base beside a full node with base prepared: placed on %v, %v; want a", n, err)
	}
	fits := []*Node{node("a", 0), warm}
	if got := Warm(Request{Pool: "t/base"}, fits); len(got) != 1 || got[0] != warm {
		t.Errorf("Warm = %v, want [warm]", ids(got))
	}
	if got := Warm(Request{}, []*Node{node("a", 0), warm}); len(got) != 2 {
		t.Errorf("Warm without a pool key = %v, want both", ids(got))
	}
	// A node whose commitment is at its limit with prestarted sandboxes
	// in it still takes the creates those serve: each takes one, whose
	// memory is counted already. Other creates go elsewhere.
	full := node("full", 16384)
	full.Pooled = map[string]int{"t/base": 5}
	for range 20 {
		if n, err := b.Place(Request{Template: "base", Pool: "t/base"}, []*Node{full, node("a", 0)}); err != nil || n.ID != "full" {
			t.Fatalf("a create of base on a full node with base prestarted: placed on %v, %v; want full", n, err)
		}
		if n, err := b.Place(Request{Template: "base", Pool: "t/code"}, []*Node{full, node("a", 0)}); err != nil || n.ID != "a" {
			t.Fatalf("a create of code beside a full node with base prestarted: placed on %v, %v; want a", n, err)
		}
	}
	if _, err := b.Place(Request{Template: "base"}, []*Node{full}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("a create from no pool on a full node: %v, want ErrNoCapacity", err)
	}
	full.Pooled["t/base"] = 0
	if _, err := b.Place(Request{Template: "base", Pool: "t/base"}, []*Node{full}); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("a create on a full node whose pool is taken: %v, want ErrNoCapacity", err)
	}
}

// TestBestOfK: each choice is the one with the most headroom of K
// distinct nodes drawn from the seeded source, the first drawn on a tie,
// and the same seed makes the same choices.
func TestBestOfK(t *testing.T) {
	var nodes []*Node
	for i := range 10 {
		nodes = append(nodes, node(fmt.Sprint(i), 1000*(i%5)))
	}
	for _, k := range []int{1, 2, 3} {
		b := NewBestOfK(k, rand.New(rand.NewPCG(7, uint64(k))))
		draws := rand.New(rand.NewPCG(7, uint64(k)))
		var got []string
		for range 200 {
			want := -1
			var drawn []int
			for len(drawn) < k {
				i := draws.IntN(len(nodes))
				if slices.Contains(drawn, i) {
					continue // distinct nodes
				}
				drawn = append(drawn, i)
				if want < 0 || nodes[i].Load.CommittedMB < nodes[want].Load.CommittedMB {
					want = i
				}
			}
			n, err := b.Place(Request{}, nodes)
			if err != nil || n != nodes[want] {
				t.Fatalf("k=%d: placed on %v, %v; want %s", k, n, err, nodes[want].ID)
			}
			got = append(got, n.ID)
		}
		again := NewBestOfK(k, rand.New(rand.NewPCG(7, uint64(k))))
		for i := range got {
			if n, _ := again.Place(Request{}, nodes); n.ID != got[i] {
				t.Fatalf("k=%d: the same seed chose %s, then %s", k, got[i], n.ID)
			}
		}
	}
	// Two nodes, two choices: both are compared every time, so the
	// emptier always wins, and a tie goes either way.
	pair := []*Node{node("a", 4000), node("b", 2000)}
	b2 := NewBestOfK(DefaultK, rand.New(rand.NewPCG(5, 6)))
	for range 200 {
		if n, err := b2.Place(Request{}, pair); err != nil || n.ID != "b" {
			t.Fatalf("best of two of two nodes: placed on %v, %v; want the emptier, b", n, err)
		}
	}
	tied := map[string]int{}
	for range 200 {
		n, _ := b2.Place(Request{}, []*Node{node("a", 0), node("b", 0)})
		tied[n.ID]++
	}
	if tied["a"] == 0 || tied["b"] == 0 {
		t.Errorf("two equal nodes: placed %v, want both used", tied)
	}
	if b := NewBestOfK(0, nil); b.k != 1 {
		t.Errorf("k below 1: %d", b.k)
	}
	// The global source, concurrently (go test -race).
	b := NewBestOfK(DefaultK, nil)
	done := make(chan bool)
	for range 4 {
		go func() {
			for range 100 {
				if _, err := b.Place(Request{}, nodes); err != nil {
					t.Error(err)
				}
			}
			done <- true
		}()
	}
	for range 4 {
		<-done
	}
}

// TestSpread: placing sandboxes one after another on what each placement
// left, best of two keeps the busiest node near the mean, where one random
// choice would not.
func TestSpread(t *testing.T) {
	spread := func(k int) float64 {
		nodes := make([]*Node, 100)
		for i := range nodes {
			nodes[i] = &Node{ID: fmt.Sprint(i), Rule: capacity.Rule{MemoryMB: 65536, CPUCount: 8}}
		}
		b := NewBestOfK(k, rand.New(rand.NewPCG(1, 1)))
		for range 10_000 {
			n, err := b.Place(Request{}, nodes)
			if err != nil {
				t.Fatal(err)
			}
			n.Load.CommittedMB += 512
		}
		most, total := 0, 0
		for _, n := range nodes {
			most, total = max(most, n.Load.CommittedMB), total+n.Load.CommittedMB
		}
		return float64(most) / (float64(total) / float64(len(nodes)))
	}
	if s := spread(DefaultK); s > 1.1 {
		t.Errorf("best of two: the busiest node holds %.2fx the mean", s)
	}
	if s := spread(1); s < 1.15 {
		t.Errorf("one random choice spreads as well as two (%.2fx the mean): the test cannot tell them apart", s)
	}
}
