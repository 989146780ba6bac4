package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/state"
)

// candidates names each test cluster apart in the deadline election.
var candidates atomic.Int64

func openCluster(t *testing.T, st state.Store, n *nodetest.Fake) *Cluster {
	t.Helper()
	c, err := Open(context.Background(), Config{State: st, Local: n, Candidate: fmt.Sprintf("server-%d", candidates.Add(1)),
		TickInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background(), StopKeep) }) // again, for a test that closed it: a no-op
	return c
}

func create(t *testing.T, c *Cluster, timeout time.Duration) *Sandbox {
	t.Helper()
	sb, err := c.Create(context.Background(), CreateRequest{Spec: Spec{Timeout: timeout, Metadata: map[string]string{"k": "v"}}, TemplateID: "base", EnvVars: map[string]string{"SECRET": "hunter2"}})
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// TestRecordsOutliveTheCluster: a new Cluster on the same store sees every
// sandbox as the old one left it, and user secrets are not in the store.
func TestRecordsOutliveTheCluster(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	n := nodetest.NewFake("n1")
	c := openCluster(t, st, n)
	a := create(t, c, time.Hour)
	b := create(t, c, time.Hour)
	if err := c.Pause(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx, StopKeep); err != nil {
		t.Fatal(err)
	}
	entries, _, err := st.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(string(e.Value), "hunter2") {
			t.Fatalf("an env var is stored in plain text under %s", e.Key)
		}
	}

	c2 := openCluster(t, st, n)
	defer c2.Close(ctx, StopKeep)
	got, err := c2.Get(ctx, a.ID)
	if err != nil || got.State != StateRunning || got.Metadata["k"] != "v" || !got.EndAt.Equal(a.EndAt) {
		t.Fatalf("running sandbox after reopening: %+v, %v", got, err)
	}
	got, err = c2.Get(ctx, b.ID)
	if err != nil || got.State != StatePaused || got.SnapshotID == "" {
		t.Fatalf("paused sandbox after reopening: %+v, %v", got, err)
	}
	if _, resumed, err := c2.Connect(ctx, b.ID, time.Minute); err != nil || !resumed {
		t.Fatalf("resume after reopening: %v %v", resumed, err)
	}
}

// TestReconcile: a record whose sandbox is gone is reported lost with its
// reason; a sandbox without a record is killed; a pause cut short after
// its snapshot was saved is finished.
func TestReconcile(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	n := nodetest.NewFake("n1")
	c := openCluster(t, st, n)
	lost := create(t, c, time.Hour)
	kept := create(t, c, time.Hour)
	pausing := create(t, c, time.Hour)
	c.Close(ctx, StopKeep)

	// Behind the cluster's back: one sandbox dies, one appears without a
	// record, and one is mid-pause with its snapshot saved.
	n.Vanish(lost.ID)
	n.Adopt(&nodev1.Sandbox{Id: "orphan"})
	if _, err := c.recs.mutate(ctx, pausing.ID, func(r *record) error {
		r.Op, r.OpSince = "pause", time.Now()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Snapshot(ctx, &nodev1.SnapshotRequest{SandboxId: pausing.ID, Kind: string(snapshot.KindPause), Stop: true}); err != nil {
		t.Fatal(err)
	}

	c2 := openCluster(t, st, n)
	defer c2.Close(ctx, StopKeep)
	_, err := c2.Get(ctx, lost.ID)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "lost") {
		t.Fatalf("lost sandbox: %v, want ErrNotFound saying it was lost", err)
	}
	if n.IsRunning("orphan") {
		t.Fatal("a sandbox without a record was left running")
	}
	if got, err := c2.Get(ctx, kept.ID); err != nil || got.State != StateRunning {
		t.Fatalf("kept sandbox: %+v %v", got, err)
	}
	if got, err := c2.Get(ctx, pausing.ID); err != nil || got.State != StatePaused || got.SnapshotID == "" {
		t.Fatalf("sandbox whose pause was cut short: %+v %v, want paused", got, err)
	}
	if l := c2.List(ListFilter{}); len(l) != 2 {
		t.Fatalf("listed %d sandboxes, want 2", len(l))
	}
}

// TestDeadlinesByOneLeader: two clusters on one store (two API servers);
// a deadline is enforced once, also one that passed while neither ran.
func TestDeadlinesByOneLeader(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	n := nodetest.NewFake("n1")
	c := openCluster(t, st, n)
	early := create(t, c, time.Hour)
	// Make its deadline pass while no cluster runs.
	if _, err := c.recs.mutate(ctx, early.ID, func(r *record) error {
		r.EndAt = time.Now().Add(-time.Minute)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx, StopKeep)
	if !n.IsRunning(early.ID) {
		t.Fatal("closing the cluster killed a sandbox")
	}

	c1 := openCluster(t, st, n)
	defer c1.Close(ctx, StopKeep)
	c2 := openCluster(t, st, n)
	defer c2.Close(ctx, StopKeep)
	waitFor(t, func() bool { return !n.IsRunning(early.ID) }, "the overdue sandbox to be killed")

	later := create(t, c2, 300*time.Millisecond)
	waitFor(t, func() bool { return !n.IsRunning(later.ID) }, "a sandbox to time out")
	kills := 0
	for _, id := range n.Killed() {
		if id == later.ID {
			kills++
		}
	}
	if kills != 1 {
		t.Fatalf("the timed-out sandbox was killed %d times, want once", kills)
	}
	if _, err := c1.Get(ctx, later.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the other server still sees the timed-out sandbox: %v", err)
	}
}

// TestStoreDown: with the store unreachable, changes fail with
// ErrUnavailable, reads of known sandboxes still work.
func TestStoreDown(t *testing.T) {
	ctx := context.Background()
	st := &flakyStore{Store: state.NewMemory()}
	n := nodetest.NewFake("n1")
	c := openCluster(t, st, n)
	defer c.Close(ctx, StopKeep)
	sb := create(t, c, time.Hour)
	st.down.Store(true)
	if _, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute}, TemplateID: "base"}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("create with the store down: %v, want ErrUnavailable", err)
	}
	if l, _ := n.List(ctx, nil); len(l.Sandboxes) != 1 {
		t.Fatalf("a create that could not be recorded left a sandbox running")
	}
	if _, err := c.SetTimeout(ctx, sb.ID, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("set timeout with the store down: %v, want ErrUnavailable", err)
	}
	if got, err := c.Get(ctx, sb.ID); err != nil || got.ID != sb.ID {
		t.Fatalf("get of a known sandbox with the store down: %v", err)
	}
	st.down.Store(false)
	if _, err := c.SetTimeout(ctx, sb.ID, time.Minute); err != nil {
		t.Fatalf("set timeout once the store is back: %v", err)
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

// flakyStore answers ErrUnavailable to every read and write while down,
// as an etcd without quorum does.
type flakyStore struct {
	state.Store
	down atomic.Bool
}

func (s *flakyStore) err() error {
	if s.down.Load() {
		return fmt.Errorf("flaky: %w", state.ErrUnavailable)
	}
	return nil
}

func (s *flakyStore) Get(ctx context.Context, key string) (state.Entry, error) {
	if err := s.err(); err != nil {
		return state.Entry{}, err
	}
	return s.Store.Get(ctx, key)
}

func (s *flakyStore) Create(ctx context.Context, key string, v []byte, o state.WriteOptions) (int64, error) {
	if err := s.err(); err != nil {
		return 0, err
	}
	return s.Store.Create(ctx, key, v, o)
}

func (s *flakyStore) Update(ctx context.Context, key string, v []byte, rev int64, o state.WriteOptions) (int64, error) {
	if err := s.err(); err != nil {
		return 0, err
	}
	return s.Store.Update(ctx, key, v, rev, o)
}

// TestSizeLimits: oversize env vars and metadata are refused naming the
// field, and nothing is started.
func TestSizeLimits(t *testing.T) {
	ctx := context.Background()
	n := nodetest.NewFake("n1")
	c := openCluster(t, state.NewMemory(), n)
	defer c.Close(ctx, StopKeep)
	big := strings.Repeat("x", 900<<10)
	for _, tc := range []struct {
		req  CreateRequest
		want string
	}{
		{CreateRequest{EnvVars: map[string]string{"BIG": big}}, `envVars["BIG"]`},
		{CreateRequest{EnvVars: map[string]string{"A": strings.Repeat("x", 30<<10), "B": strings.Repeat("x", 30<<10), "C": strings.Repeat("x", 30<<10)}}, "envVars take"},
		{CreateRequest{EnvVars: map[string]string{strings.Repeat("N", 300): "v"}}, "env var name"},
		{CreateRequest{Spec: Spec{Metadata: map[string]string{"k": big}}}, `metadata["k"]`},
		{CreateRequest{Spec: Spec{Metadata: map[string]string{strings.Repeat("k", 200): "v"}}}, "metadata key"},
	} {
		tc.req.TemplateID, tc.req.Timeout = "base", time.Minute
		_, err := c.Create(ctx, tc.req)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create with %s: %v, want ErrInvalid naming it", tc.want, err)
		}
	}
	if l, _ := n.List(ctx, nil); len(l.Sandboxes) != 0 {
		t.Fatal("a refused create started a sandbox")
	}
}

// TestMigrateLegacyPausedRecords: the paused-sandbox files of servers
// before the state store move into it on first start; a record whose
// snapshot is gone is dropped, and the files are removed.
func TestMigrateLegacyPausedRecords(t *testing.T) {
	ctx := context.Background()
	n := nodetest.NewFake("n1")
	n.PutSnapshot(&snapshot.Snapshot{ID: "snapkept", Kind: snapshot.KindPause, SandboxID: "oldpaused"})
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "paused"), 0o700)
	// As the old server wrote them: the Sandbox struct without JSON tags.
	os.WriteFile(filepath.Join(dir, "paused", "oldpaused.json"), []byte(
		`{"ID":"oldpaused","TemplateID":"base","NodeID":"n1","Metadata":{"k":"v"},"State":"paused","SnapshotID":"snapkept","MemoryMB":512}`), 0o600)
	os.WriteFile(filepath.Join(dir, "paused", "nosnap.json"), []byte(
		`{"ID":"nosnap","TemplateID":"base","State":"paused","SnapshotID":"gone"}`), 0o600)
	c, err := Open(ctx, Config{State: state.NewMemory(), Local: n, Candidate: "test", LegacyStateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx, StopKeep)
	sb, err := c.Get(ctx, "oldpaused")
	if err != nil || sb.State != StatePaused || sb.SnapshotID != "snapkept" || sb.Metadata["k"] != "v" {
		t.Fatalf("migrated record: %+v, %v", sb, err)
	}
	if _, err := c.Get(ctx, "nosnap"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a record without its snapshot: %v, want ErrNotFound", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "paused", "*.json")); len(left) != 0 {
		t.Fatalf("legacy files left: %v", left)
	}
}

// TestNodeRegistry: a registered node is listed ready with what it
// reports; a drained one takes no creates (ErrNoCapacity) until undrained;
// one that stops reporting is listed lost; an unknown id is ErrNotFound.
func TestNodeRegistry(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	n := nodetest.NewFake("n1")
	c := openCluster(t, st, n)
	defer c.Close(ctx, StopKeep)
	reg, err := membership.RegisterNode(ctx, st, func() NodeInfo {
		return NodeInfo{ID: "n1", Capacity: NodeUsage{CPUCount: 2, MemoryMB: 4096}, Runtime: "gvisor"}
	}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	create(t, c, time.Hour)
	got, err := c.GetNode(ctx, "n1")
	if err != nil || got.State != NodeReady || got.Capacity.MemoryMB != 4096 || got.Sandboxes != 1 || got.Runtime != "gvisor" {
		t.Fatalf("registered node: %+v, %v", got, err)
	}
	if got, err = c.SetDraining(ctx, "n1", true); err != nil || got.State != NodeDraining {
		t.Fatalf("draining: %+v, %v", got, err)
	}
	if _, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute}, TemplateID: "base"}); !errors.Is(err, ErrNoCapacity) || !strings.Contains(err.Error(), "draining") {
		t.Fatalf("create on a draining node: %v, want ErrNoCapacity saying so", err)
	}
	if _, err := c.SetDraining(ctx, "n1", false); err != nil {
		t.Fatal(err)
	}
	// Placement sees the mark through its watch, a moment later.
	waitFor(t, func() bool {
		_, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Hour}, TemplateID: "base"})
		return err == nil
	}, "a create on the undrained node")
	reg.Stop()
	if err := membership.DeregisterNode(ctx, st, "n1"); err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetNode(ctx, "n1"); err != nil || got.State != NodeLost {
		t.Fatalf("node that stopped reporting: %+v, %v; want lost", got, err)
	}
	if _, err := c.GetNode(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown node: %v, want ErrNotFound", err)
	}
}

// TestPausedRetention: a paused sandbox kept past the retention is deleted
// with its snapshot by the elected server; a younger one and a running one
// stay, and a resumed one is no longer counted as paused.
func TestPausedRetention(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	n := nodetest.NewFake("n1")
	c, err := Open(ctx, Config{State: st, Local: n, Candidate: fmt.Sprintf("server-%d", candidates.Add(1)),
		TickInterval: 20 * time.Millisecond, PausedRetention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx, StopKeep)
	old, young, running := create(t, c, time.Hour), create(t, c, time.Hour), create(t, c, time.Hour)
	for _, sb := range []*Sandbox{old, young} {
		if err := c.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	p, err := c.Get(ctx, young.ID)
	if err != nil || p.PausedAt.IsZero() {
		t.Fatalf("a paused sandbox without its pause time: %+v %v", p, err)
	}
	oldSnap := ""
	if _, err := c.recs.mutate(ctx, old.ID, func(r *record) error {
		r.PausedAt = time.Now().Add(-2 * time.Hour)
		oldSnap = r.SnapshotID
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { _, err := c.Get(ctx, old.ID); return errors.Is(err, ErrNotFound) }, "the old paused sandbox to be reclaimed")
	waitFor(t, func() bool { return !n.HasSnapshot(oldSnap) }, "its snapshot to be deleted")
	time.Sleep(100 * time.Millisecond)
	for _, sb := range []*Sandbox{young, running} {
		if _, err := c.Get(ctx, sb.ID); err != nil {
			t.Fatalf("sandbox %s reclaimed before its time: %v", sb.ID, err)
		}
	}
	if _, _, err := c.Connect(ctx, young.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if r, _ := c.Get(ctx, young.ID); !r.PausedAt.IsZero() {
		t.Fatalf("a resumed sandbox keeps its pause time: %v", r.PausedAt)
	}
}

// TestCreateWhoseRecordLandedLate: a record write that reports failure
// (its caller gone) but was applied does not leave a record of the
// sandbox the failed create killed.
func TestCreateWhoseRecordLandedLate(t *testing.T) {
	ctx := context.Background()
	st := &lateStore{Store: state.NewMemory()}
	n := nodetest.NewFake("n1")
	c := openCluster(t, st, n)
	defer c.Close(ctx, StopKeep)
	st.late.Store(true)
	if _, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Minute}, TemplateID: "base"}); err == nil {
		t.Fatal("a create whose record write reported failure succeeded")
	}
	st.late.Store(false)
	if l, _ := n.List(ctx, nil); len(l.Sandboxes) != 0 {
		t.Fatalf("the failed create left %d sandboxes on the node", len(l.Sandboxes))
	}
	es, _, err := st.List(ctx, sandboxPrefix)
	if err != nil || len(es) != 0 {
		t.Fatalf("the failed create left %d records (%v)", len(es), err)
	}
}

// lateStore applies sandbox record creates while late is set, then
// reports them cancelled, as a write whose caller left mid-way can be.
type lateStore struct {
	state.Store
	late atomic.Bool
}

func (s *lateStore) Create(ctx context.Context, key string, v []byte, o state.WriteOptions) (int64, error) {
	rev, err := s.Store.Create(ctx, key, v, o)
	if err == nil && s.late.Load() && strings.HasPrefix(key, sandboxPrefix) {
		return 0, fmt.Errorf("late: %w", context.Canceled)
	}
	return rev, err
}
