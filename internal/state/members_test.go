package state_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// TestEmbeddedMembers: three embedded members make one cluster that
// outlives any one of them. The first ran alone before (no peers) and
// records its peer URL when it starts with one; the others are added as
// learners and promote themselves; a write on one member is read on the
// others, and with one member down the two left still take writes; the
// stopped one starts again from its data and catches up. AddMember
// refuses a name or a peer URL the cluster has, answers a retry for a
// member that never started the same, and RemoveMember shrinks the
// cluster.
func TestEmbeddedMembers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	url := func() string { return fmt.Sprintf("http://127.0.0.1:%d", freePort(t)) }
	type member struct {
		cfg state.Config
		e   *state.Etcd
	}
	mk := func(name string) *member {
		return &member{cfg: state.Config{DataDir: filepath.Join(dir, name), SocketDir: shortDir(t),
			ClientURLs: []string{url()}, PeerURLs: []string{url()}, MemberName: name, Logger: quiet()}}
	}
	start := func(m *member) {
		t.Helper()
		m.e = openEtcd(t, m.cfg)
	}
	stop := func(m *member) {
		t.Helper()
		if err := m.e.Close(); err != nil {
			t.Fatal(err)
		}
	}

	a := mk("aenv")
	// Alone first, with no peer listener, as a single server runs.
	alone := a.cfg
	alone.PeerURLs, alone.MemberName = nil, ""
	a.e = openEtcd(t, alone)
	if _, err := a.e.Put(ctx, "k", []byte("before"), state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.e.AddMember(ctx, "b", []string{url()}); !errors.Is(err, state.ErrNoPeers) {
		t.Fatalf("adding a member to a member with no peer listener: %v", err)
	}
	stop(a)
	start(a)
	ms, err := a.e.Members(ctx)
	if err != nil || len(ms) != 1 || !slices.Equal(ms[0].PeerURLs, a.cfg.PeerURLs) || !ms[0].Leader {
		t.Fatalf("the first member, started with a peer URL: %+v %v", ms, err)
	}

	b, c := mk("b"), mk("c")
	for _, m := range []*member{b, c} {
		ic, err := a.e.AddMember(ctx, m.cfg.MemberName, m.cfg.PeerURLs)
		if err != nil {
			t.Fatal(err)
		}
		// A retry before it started: the same answer, no second member.
		if again, err := a.e.AddMember(ctx, m.cfg.MemberName, m.cfg.PeerURLs); err != nil || again != ic {
			t.Fatalf("adding %s again before it started: %q %v, want %q", m.cfg.MemberName, again, err, ic)
		}
		m.cfg.InitialCluster = ic
		start(m)
	}
	ms, err = b.e.Members(ctx)
	if err != nil || len(ms) != 3 {
		t.Fatalf("members: %+v %v", ms, err)
	}
	for _, m := range ms {
		if m.Learner || !m.Started {
			t.Fatalf("member %+v: still a learner, or not started", m)
		}
	}
	if eps := c.e.Endpoints(); len(eps) != 3 || eps[0] != c.cfg.ClientURLs[0] {
		t.Fatalf("c's endpoints %v: want its own first, then the two others'", eps)
	}
	if en, err := c.e.Get(ctx, "k"); err != nil || string(en.Value) != "before" {
		t.Fatalf("the first member's record on the third: %q %v", en.Value, err)
	}

	if _, err := a.e.AddMember(ctx, "b", []string{url()}); !errors.Is(err, state.ErrMemberExists) {
		t.Fatalf("adding a member under a name the cluster has: %v", err)
	}
	if _, err := a.e.AddMember(ctx, "d", b.cfg.PeerURLs); !errors.Is(err, state.ErrMemberExists) {
		t.Fatalf("adding a member at another's peer URL: %v", err)
	}

	// One down: two of three are a quorum.
	stop(a)
	if _, err := b.e.Put(ctx, "k", []byte("after"), state.WriteOptions{}); err != nil {
		t.Fatalf("writing with one member of three down: %v", err)
	}
	if en, err := c.e.Get(ctx, "k"); err != nil || string(en.Value) != "after" {
		t.Fatalf("reading on c: %q %v", en.Value, err)
	}
	start(a)
	if en, err := a.e.Get(ctx, "k"); err != nil || string(en.Value) != "after" {
		t.Fatalf("the restarted member: %q %v", en.Value, err)
	}

	stop(c)
	if err := a.e.RemoveMember(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := a.e.RemoveMember(ctx, "c"); !errors.Is(err, state.ErrNotFound) {
		t.Fatalf("removing a member gone: %v", err)
	}
	if ms, err := a.e.Members(ctx); err != nil || len(ms) != 2 {
		t.Fatalf("members after removing c: %+v %v", ms, err)
	}
	if _, err := b.e.Put(ctx, "k", []byte("two"), state.WriteOptions{}); err != nil {
		t.Fatalf("writing on two members: %v", err)
	}
}

// TestMemberAdvertises: a standalone member advertises the URLs it is
// told to, not those it listens on (a pod listening on its IP, reached
// by a name that outlives the IP); an unspecified address is no URL to
// advertise.
func TestMemberAdvertises(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cport, pport := freePort(t), freePort(t)
	mc := state.MemberConfig{Name: "m", DataDir: t.TempDir(), NewCluster: true,
		ClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", cport)}, PeerURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", pport)},
		AdvertiseClientURLs: []string{fmt.Sprintf("http://localhost:%d", cport)}, AdvertisePeerURLs: []string{fmt.Sprintf("http://localhost:%d", pport)},
	}
	mc.InitialCluster = "m=" + mc.AdvertisePeerURLs[0]
	bad := mc
	bad.AdvertiseClientURLs = []string{fmt.Sprintf("http://0.0.0.0:%d", cport)}
	if err := state.RunMember(ctx, bad, quiet()); err == nil || !strings.Contains(err.Error(), "0.0.0.0") {
		t.Fatalf("advertising 0.0.0.0: %v", err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- state.RunMember(mctx, mc, quiet()) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	e := openEtcd(t, state.Config{Endpoints: mc.ClientURLs})
	ms, err := e.Members(ctx)
	if err != nil || len(ms) != 1 || !slices.Equal(ms[0].ClientURLs, mc.AdvertiseClientURLs) || !slices.Equal(ms[0].PeerURLs, mc.AdvertisePeerURLs) {
		t.Fatalf("the member lists itself as %+v (%v), want the advertised URLs %v %v", ms, err, mc.AdvertiseClientURLs, mc.AdvertisePeerURLs)
	}
}
