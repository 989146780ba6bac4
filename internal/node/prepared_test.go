package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// fakeSaver is fakeRuntime with checkpoints and prepared sandboxes: a
// checkpoint writes a file into the image directory and leaves the
// sandbox as it was (a frozen one's envd still answers: nothing here
// reads it), a restore starts an envd as a create does, and a prepared
// sandbox runs none until a restore fills it.
type fakeSaver struct {
	*fakeRuntime

	mu sync.Mutex
	// holdKills, while set, keeps every Kill waiting until it is closed.
	holdKills chan struct{}
	// prepared are the sandboxes prepared and not yet restored into.
	prepared map[string]bool
	// restoredInto counts restores into prepared sandboxes.
	restoredInto int
}

var (
	_ runtime.Checkpointer = (*fakeSaver)(nil)
	_ runtime.Preparer     = (*fakeSaver)(nil)
)

func newFakeSaver(rt *fakeRuntime) *fakeSaver {
	return &fakeSaver{fakeRuntime: rt, prepared: map[string]bool{}}
}

func (s *fakeSaver) Checkpoint(ctx context.Context, id, imageDir string, opts runtime.CheckpointOptions) error {
	s.fakeRuntime.mu.Lock()
	_, ok := s.running[id]
	s.fakeRuntime.mu.Unlock()
	if !ok {
		return fmt.Errorf("fake saver: checkpointing %s: %w", id, runtime.ErrNotFound)
	}
	return os.WriteFile(filepath.Join(imageDir, "state"), []byte(id), 0o600)
}

func (s *fakeSaver) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	if _, err := os.Stat(filepath.Join(imageDir, "state")); err != nil {
		return fmt.Errorf("fake saver: restoring %s: %w", spec.ID, err)
	}
	return s.Create(ctx, spec)
}

func (s *fakeSaver) Thaw(context.Context, string) error { return nil }

func (s *fakeSaver) Prepare(ctx context.Context, spec runtime.Spec) error {
	s.fakeRuntime.mu.Lock()
	defer s.fakeRuntime.mu.Unlock()
	if _, ok := s.running[spec.ID]; ok {
		return fmt.Errorf("fake saver: %s exists", spec.ID)
	}
	s.running[spec.ID] = nil
	s.specs[spec.ID] = spec
	s.mu.Lock()
	s.prepared[spec.ID] = true
	s.mu.Unlock()
	return nil
}

func (s *fakeSaver) RestorePrepared(ctx context.Context, spec runtime.Spec, imageDir string) error {
	s.mu.Lock()
	ok := s.prepared[spec.ID]
	delete(s.prepared, spec.ID)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("fake saver: %s is not prepared: %w", spec.ID, runtime.ErrNotFound)
	}
	if _, err := os.Stat(filepath.Join(imageDir, "state")); err != nil {
		return fmt.Errorf("fake saver: restoring into %s: %w", spec.ID, err)
	}
	e, err := startEnvd(spec.HostAddr, false)
	if err != nil {
		return err
	}
	s.fakeRuntime.mu.Lock()
	s.running[spec.ID] = e
	s.specs[spec.ID] = spec
	s.fakeRuntime.mu.Unlock()
	s.mu.Lock()
	s.restoredInto++
	s.mu.Unlock()
	return nil
}

func (s *fakeSaver) Kill(ctx context.Context, id string) error {
	s.mu.Lock()
	hold := s.holdKills
	delete(s.prepared, id)
	s.mu.Unlock()
	if hold != nil {
		<-hold
	}
	return s.fakeRuntime.Kill(ctx, id)
}

func (s *fakeSaver) preparedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.prepared)
}

// preparingNode starts a node of h whose runtime checkpoints and
// prepares, with a warm pool whose floor is one of the test template.
func preparingNode(t *testing.T, h *host) (*Node, *fakeSaver) {
	t.Helper()
	saver := newFakeSaver(h.rt)
	snaps, err := snapshot.Open(filepath.Join(t.TempDir(), "snapshots"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := poolConfig(h, 1<<30, 1)
	cfg.Runtime, cfg.Snapshots = saver, snaps
	n, _ := h.start(cfg)
	return n, saver
}

// ownSizePrepared is the pool key of the test template's prepared sandboxes
// at its own size.
var ownSizePrepared = PoolKey{TemplateID: testTemplate, Restores: true}

// nodeWithPrepared is preparingNode once its pool holds a prepared
// sandbox of the test template's own size.
func nodeWithPrepared(t *testing.T, h *host) (*Node, *fakeSaver) {
	t.Helper()
	n, saver := preparingNode(t, h)
	waitFor(t, func() bool { return poolStatus(t, n, ownSizePrepared).Ready == 1 }, "a prepared sandbox of the template's size")
	return n, saver
}

// The pool's floor holds prepared sandboxes too, without a restore
// having asked for one: the first resume of a node's life is warm.
func TestWarmPoolFloorPrepares(t *testing.T) {
	h := newHost(t)
	n, saver := preparingNode(t, h)
	restores := PoolKey{TemplateID: testTemplate, Restores: true}
	waitFor(t, func() bool {
		return poolStatus(t, n, restores).Ready == 1 && saver.preparedCount() == 1 &&
			poolStatus(t, n, PoolKey{TemplateID: testTemplate}).Ready == 1
	}, "a prepared and a prestarted sandbox of the floor")
}

// A resume right after a pause restores into a prepared sandbox, under
// that one's runtime name, without waiting for the paused sandbox's
// processes to be released; the release that ends after it leaves the
// resumed sandbox's local record alone.
func TestResumeDoesNotWaitForTheRelease(t *testing.T) {
	h := newHost(t)
	n, saver := nodeWithPrepared(t, h)
	ctx := context.Background()

	sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, TeamID: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	oldRT := sb.rt()
	hold := make(chan struct{})
	saver.mu.Lock()
	saver.holdKills = hold
	saver.mu.Unlock()
	released := false
	release := func() {
		if !released {
			released = true
			saver.mu.Lock()
			saver.holdKills = nil
			saver.mu.Unlock()
			close(hold)
		}
	}
	t.Cleanup(release)

	snap, err := n.Snapshot(ctx, sb.ID, SnapshotOptions{Kind: snapshot.KindPause, Stop: true})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	resumed, err := n.Create(rctx, CreateRequest{SnapshotID: snap.ID, SandboxID: sb.ID, TeamID: "t1"})
	if err != nil {
		t.Fatalf("resuming while the paused sandbox is being released: %v", err)
	}
	if resumed.rt() == oldRT || resumed.rt() == sb.ID {
		t.Fatalf("the resume runs under runtime name %s, not a prepared sandbox's (paused one: %s)", resumed.rt(), oldRT)
	}
	if saver.restoredInto != 1 {
		t.Fatalf("%d restores into prepared sandboxes, want 1", saver.restoredInto)
	}
	h.rt.mu.Lock()
	_, held := h.rt.running[oldRT]
	h.rt.mu.Unlock()
	if !held {
		t.Fatal("the paused sandbox was gone before the resume ended: the test held nothing")
	}
	// The paused sandbox dies on its own before its release ends: that is
	// not the resumed one's death. A prestarted sandbox's death after it
	// tells when the exits were handled.
	// Each condition reads the pool once: the pool changes between reads.
	var marker string
	waitFor(t, func() bool {
		if l := n.pool.listOf(false); len(l) == 1 {
			marker = l[0].ID
			return true
		}
		return false
	}, "the prestarted sandbox of the floor")
	h.rt.crash(oldRT, false)
	h.rt.crash(marker, false)
	waitFor(t, func() bool {
		l := n.pool.listOf(false)
		return len(l) == 0 || l[0].ID != marker
	}, "the prestarted sandbox's death")
	if got, err := n.Get(sb.ID); err != nil || got.rt() != resumed.rt() {
		t.Fatalf("after the paused sandbox died: the resumed one is %v, %v", got, err)
	}
	if h.rt.envdOf(resumed.rt()) == nil {
		t.Fatal("the paused sandbox's death took the resumed one's runtime sandbox")
	}
	release()
	waitFor(t, func() bool {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		_, ok := h.rt.running[oldRT]
		return !ok
	}, "the paused sandbox's release")
	if err := n.Close(ctx, KeepSandboxes); err != nil { // waits for the release
		t.Fatal(err)
	}
	if _, err := os.Stat(n.recordPath(sb.ID)); err != nil {
		t.Fatalf("the resumed sandbox's local record after the paused one's release: %v", err)
	}
	cfg := h.config()
	cfg.Runtime = saver
	_, kept := h.start(cfg)
	if len(kept) != 1 || kept[0].ID != sb.ID || kept[0].rt() != resumed.rt() {
		t.Fatalf("a restart kept %v, want %s under runtime name %s", kept, sb.ID, resumed.rt())
	}
}

// A sandbox of another size than its template's resumes warm too, once
// the pool has learned that size: prepared sandboxes are kept per size,
// and one of the template's own is never loaded with a larger state.
func TestPreparedPerSize(t *testing.T) {
	h := newHost(t)
	n, saver := nodeWithPrepared(t, h)
	ctx := context.Background()
	own := ownSizePrepared

	sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, CPUCount: 2, MemoryMB: 512, TeamID: "t1"})
	if err != nil {
		t.Fatal(err)
	}
	resume := func() *Sandbox {
		t.Helper()
		snap, err := n.Snapshot(ctx, sb.ID, SnapshotOptions{Kind: snapshot.KindPause, Stop: true})
		if err != nil {
			t.Fatal(err)
		}
		got, err := n.Create(ctx, CreateRequest{SnapshotID: snap.ID, SandboxID: sb.ID, TeamID: "t1"})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := resume(); got.rt() != sb.ID || saver.restoredInto != 0 {
		t.Fatalf("the first resume of a 2-CPU sandbox ran as %s with %d restores into prepared sandboxes; want a cold one (none of its size yet)", got.rt(), saver.restoredInto)
	}
	sized := PoolKey{TemplateID: testTemplate, Restores: true, Shape: Shape{CPUCount: 2, MemoryMB: 512}}
	waitFor(t, func() bool { return poolStatus(t, n, sized).Ready == 1 }, "a prepared sandbox of the resumed one's size")
	if got := poolStatus(t, n, own).Ready; got != 1 {
		t.Fatalf("the template's own prepared sandboxes: %d, want the 1 of the floor untouched", got)
	}
	got := resume()
	if saver.restoredInto != 1 {
		t.Fatalf("the second resume: %d restores into prepared sandboxes, want 1", saver.restoredInto)
	}
	h.rt.mu.Lock()
	spec := h.rt.specs[got.rt()]
	h.rt.mu.Unlock()
	if spec.CPUCount != 2 || spec.MemoryMB != 512 {
		t.Fatalf("resumed into a sandbox prepared with %d CPUs and %d MiB, want 2 and 512", spec.CPUCount, spec.MemoryMB)
	}
	if got.CPUCount != 2 || got.MemoryMB != 512 {
		t.Fatalf("the resumed sandbox reports %d CPUs and %d MiB, want 2 and 512", got.CPUCount, got.MemoryMB)
	}
}

// TestPoolPerTemplate: prepared sandboxes kept per size are reported as
// one key per template, summed; other keys stay as they are, in order.
func TestPoolPerTemplate(t *testing.T) {
	own := PoolKey{TemplateID: "a", Restores: true}
	sized := PoolKey{TemplateID: "a", Restores: true, Shape: Shape{CPUCount: 2, MemoryMB: 512}}
	w := WarmPool{Keys: []PoolStatus{
		{Key: PoolKey{TemplateID: "a"}, Ready: 2, Target: 2},
		{Key: sized, Ready: 1, Target: 2, Served: PoolCounts{Warm: 3, Cold: 1}},
		{Key: PoolKey{TemplateID: "b", Restores: true}, Ready: 1, Target: 1},
		{Key: own, Ready: 1, Target: 1, Served: PoolCounts{Warm: 5}},
	}}
	want := []PoolStatus{
		{Key: PoolKey{TemplateID: "a"}, Ready: 2, Target: 2},
		{Key: own, Ready: 2, Target: 3, Served: PoolCounts{Warm: 8, Cold: 1}},
		{Key: PoolKey{TemplateID: "b", Restores: true}, Ready: 1, Target: 1},
	}
	if got := w.PerTemplate(); !slices.Equal(got, want) {
		t.Fatalf("PerTemplate =\n%+v\nwant\n%+v", got, want)
	}
}

// TestPreparedOnlyOnTheSameImage: a snapshot saved on another image than
// the template's now (base's before it ran from its image, an older
// version of a template) restores without a prepared sandbox, which
// mounts the template's: the runtime would refuse it after taking it.
func TestPreparedOnlyOnTheSameImage(t *testing.T) {
	n, saver := nodeWithPrepared(t, newHost(t))
	ctx := context.Background()
	own := ownSizePrepared
	resume := func(rootImage string) {
		t.Helper()
		sb, err := n.Create(ctx, CreateRequest{TemplateID: testTemplate, TeamID: "t1"})
		if err != nil {
			t.Fatal(err)
		}
		n.mu.Lock()
		n.sandboxes[sb.ID].RootImage = rootImage
		n.mu.Unlock()
		snap, err := n.Snapshot(ctx, sb.ID, SnapshotOptions{Kind: snapshot.KindPause, Stop: true})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := n.Create(ctx, CreateRequest{SnapshotID: snap.ID, SandboxID: sb.ID, TeamID: "t1"}); err != nil {
			t.Fatal(err)
		}
	}
	resume("image-saved-on-another")
	if saver.restoredInto != 0 {
		t.Fatalf("a snapshot of another image was restored into a prepared sandbox")
	}
	if got := poolStatus(t, n, own).Ready; got != 1 {
		t.Fatalf("prepared sandboxes after it: %d, want the 1 untouched", got)
	}
	resume("")
	if saver.restoredInto != 1 {
		t.Fatalf("a snapshot of the template's own image: %d restores into prepared sandboxes, want 1", saver.restoredInto)
	}
}
