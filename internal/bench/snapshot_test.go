package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// fakeSnapshotAPI is a server with snapshots, pause and fork. Running
// sandboxes get a memory cgroup file under cgroups/parent, which a pause
// removes, like the real server's.
type fakeSnapshotAPI struct {
	t       *testing.T
	cgroups string // the fake memory hierarchy

	mu        sync.Mutex
	seq       int
	running   map[string]bool
	paused    map[string]bool
	ready     map[string]bool // the dirty process has written its memory
	snapshots map[string]bool
	polls     int
	// failFork makes a fork start only one child and report the others as
	// failed; failResume makes every resume fail.
	failFork, failResume bool
	// onPause runs inside Pause (e.g. to cancel the context).
	onPause func()
}

const fakeParent = "tag"

func newFakeSnapshotAPI(t *testing.T) *fakeSnapshotAPI {
	return &fakeSnapshotAPI{
		t: t, cgroups: t.TempDir(),
		running: map[string]bool{}, paused: map[string]bool{}, ready: map[string]bool{}, snapshots: map[string]bool{},
	}
}

func (f *fakeSnapshotAPI) options() Options {
	return Options{
		Snapshots: f, Template: "tpl", CgroupParent: fakeParent,
		SnapshotIterations: 3, ForkCounts: []int{1, 4}, PauseCount: 3,
		Sizes:  []Size{{Name: "small"}, {Name: "dirty", MemoryMB: 1024, DirtyMiB: 8}},
		settle: time.Millisecond, cgroupRoot: f.cgroups,
	}
}

// startLocked makes id running, with a cgroup.
func (f *fakeSnapshotAPI) startLocked(id string) {
	f.running[id] = true
	dir := filepath.Join(f.cgroups, fakeParent, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.t.Error(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.usage_in_bytes"), []byte("1048576\n"), 0o644); err != nil {
		f.t.Error(err)
	}
}

func (f *fakeSnapshotAPI) stopLocked(id string) {
	delete(f.running, id)
	if err := os.RemoveAll(filepath.Join(f.cgroups, fakeParent, id)); err != nil {
		f.t.Error(err)
	}
}

func (f *fakeSnapshotAPI) newIDLocked() string {
	f.seq++
	return fmt.Sprintf("sb%d", f.seq)
}

func (f *fakeSnapshotAPI) Create(ctx context.Context, opts client.CreateOptions) (*client.Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if opts.TemplateID != "tpl" && !f.snapshots[opts.TemplateID] {
		return nil, fmt.Errorf("no template %q", opts.TemplateID)
	}
	id := f.newIDLocked()
	f.startLocked(id)
	return &client.Sandbox{SandboxID: id, EnvdAccessToken: "tok"}, nil
}

func (f *fakeSnapshotAPI) Get(ctx context.Context, id string) (*client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running[id] && !f.paused[id] {
		return nil, fmt.Errorf("no sandbox %s", id)
	}
	return &client.Sandbox{SandboxID: id, CPUCount: 2, MemoryMB: 512}, nil
}

func (f *fakeSnapshotAPI) Run(ctx context.Context, id, cmd string, opts client.RunOptions) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running[id] {
		return -1, fmt.Errorf("run in %s, which is not running", id)
	}
	if opts.AccessToken != "tok" {
		return -1, fmt.Errorf("run without the token")
	}
	switch {
	case cmd == "true":
		return 0, nil
	case cmd == dirtyCommand(8):
		return 0, nil
	case cmd == "test -e "+readyFile:
		// Not ready on the first poll.
		f.polls++
		if f.ready[id] {
			return 0, nil
		}
		f.ready[id] = true
		return 1, nil
	}
	return -1, fmt.Errorf("unexpected command %q", cmd)
}

func (f *fakeSnapshotAPI) Kill(ctx context.Context, id string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.running[id]:
		f.stopLocked(id)
	case f.paused[id]:
		delete(f.paused, id)
	default:
		return fmt.Errorf("kill of unknown sandbox %s", id)
	}
	return nil
}

func (f *fakeSnapshotAPI) Snapshot(ctx context.Context, id string) (SnapshotInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running[id] {
		return SnapshotInfo{}, fmt.Errorf("snapshot of %s, which is not running", id)
	}
	f.seq++
	s := fmt.Sprintf("snap%d", f.seq)
	f.snapshots[s] = true
	return SnapshotInfo{SnapshotID: s, SizeBytes: 1 << 20, CPUCount: 2, MemoryMB: 512}, nil
}

func (f *fakeSnapshotAPI) DeleteSnapshot(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.snapshots[id] {
		return fmt.Errorf("no snapshot %s", id)
	}
	delete(f.snapshots, id)
	return nil
}

func (f *fakeSnapshotAPI) Pause(ctx context.Context, id string) error {
	if f.onPause != nil {
		f.onPause()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running[id] {
		return fmt.Errorf("pause of %s, which is not running", id)
	}
	f.stopLocked(id)
	f.paused[id] = true
	return nil
}

func (f *fakeSnapshotAPI) Resume(ctx context.Context, id string, timeout int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.paused[id] || timeout <= 0 {
		return fmt.Errorf("resume of %s, which is not paused", id)
	}
	if f.failResume {
		return errors.New("restore failed")
	}
	delete(f.paused, id)
	f.startLocked(id)
	return nil
}

func (f *fakeSnapshotAPI) Fork(ctx context.Context, id string, count, timeout int) ([]*client.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.running[id] {
		return nil, fmt.Errorf("fork of %s, which is not running", id)
	}
	var out []*client.Sandbox
	for i := range count {
		if f.failFork && i > 0 {
			return out, errors.New("child 2: restore failed")
		}
		c := f.newIDLocked()
		f.startLocked(c)
		out = append(out, &client.Sandbox{SandboxID: c, EnvdAccessToken: "tok"})
	}
	return out, nil
}

// leaked lists what is left: sandboxes running or paused, snapshots.
func (f *fakeSnapshotAPI) leaked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id := range f.running {
		out = append(out, "running "+id)
	}
	for id := range f.paused {
		out = append(out, "paused "+id)
	}
	for id := range f.snapshots {
		out = append(out, "snapshot "+id)
	}
	slices.Sort(out)
	return out
}

func TestMeasureAenvSnapshot(t *testing.T) {
	api := newFakeSnapshotAPI(t)
	res, err := MeasureAenvSnapshot(context.Background(), api.options())
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Aenv) != 2 || res.Aenv[0].Size.Name != "small" || res.Aenv[1].Size.Name != "dirty" || len(res.Bare) != 0 {
		t.Fatalf("sizes = %+v, bare %+v", res.Aenv, res.Bare)
	}
	for _, s := range res.Aenv {
		x := s.Samples
		for name, got := range map[string]int{
			"snapshot": len(x.Snapshot), "pause": len(x.Pause), "resume": len(x.Resume),
			"resume+command": len(x.ResumeCommand), "from snapshot": len(x.FromSnapshot),
			"fork 1": len(x.Fork[1]), "fork 4": len(x.Fork[4]),
		} {
			want := 3
			if name == "fork 4" {
				want = forkIterations(3, 4)
			}
			if got != want {
				t.Errorf("%s %s: %d samples, want %d", s.Size.Name, name, got, want)
			}
		}
		// The largest fork once more, the pool taught; an API without
		// nodes cannot say what it held.
		if len(x.ForkTaught[4]) != 1 || len(x.ForkTaught) != 1 || x.TaughtPrepared != -1 {
			t.Errorf("%s: taught forks %v, prepared %d; want one of 4, unknown", s.Size.Name, x.ForkTaught, x.TaughtPrepared)
		}
		for i := range x.Resume {
			if x.ResumeCommand[i] < x.Resume[i] {
				t.Errorf("%s: resume + command %v shorter than resume %v", s.Size.Name, x.ResumeCommand[i], x.Resume[i])
			}
		}
		if x.MemoryBytes != 1<<20 || x.ImageBytes != 1<<20 {
			t.Errorf("%s: memory %d, image %d; want the cgroup's and the snapshot's 1 MiB", s.Size.Name, x.MemoryBytes, x.ImageBytes)
		}
	}
	if api.polls < 2 {
		t.Errorf("the dirty sandbox was polled %d times, want until ready (2)", api.polls)
	}
	m := res.Memory
	if m == nil {
		t.Fatal("no memory results")
	}
	if m.Sandboxes != 3 || len(m.Pause) != 3 || len(m.Resume) != 3 {
		t.Errorf("memory: %d sandboxes, %d pauses, %d resumes; want 3 each", m.Sandboxes, len(m.Pause), len(m.Resume))
	}
	if m.Running.Cgroups != 3 || m.Running.CgroupBytes != 3<<20 || m.Paused.Cgroups != 0 || m.Resumed.Cgroups != 3 {
		t.Errorf("memory cgroups: running %+v, paused %+v, resumed %+v", m.Running, m.Paused, m.Resumed)
	}
	if m.Running.AvailableBytes <= 0 {
		t.Errorf("MemAvailable not read: %+v", m.Running)
	}
	if len(m.LeftProcesses) > 0 {
		t.Errorf("processes named after fake sandboxes: %v", m.LeftProcesses)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}

func TestMeasureAenvSnapshotForkFailureKillsTheChildren(t *testing.T) {
	api := newFakeSnapshotAPI(t)
	api.failFork = true
	_, err := MeasureAenvSnapshot(context.Background(), api.options())
	if err == nil || !strings.Contains(err.Error(), "child 2") {
		t.Errorf("err = %v, want the fork's failure", err)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}

func TestMeasureAenvSnapshotFailedResumeKillsThePausedSandbox(t *testing.T) {
	api := newFakeSnapshotAPI(t)
	api.failResume = true
	_, err := MeasureAenvSnapshot(context.Background(), api.options())
	if err == nil || !strings.Contains(err.Error(), "restore failed") {
		t.Errorf("err = %v, want the resume's failure", err)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}

func TestMeasureAenvSnapshotCancelledInMemoryStillCleansUp(t *testing.T) {
	api := newFakeSnapshotAPI(t)
	opts := api.options()
	opts.Sizes = opts.Sizes[:1]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pauses := 0
	// The size's pause/resume loop pauses 3 times; cancel during the
	// memory measurement's second pause, with one sandbox paused.
	api.onPause = func() {
		if pauses++; pauses == 5 {
			cancel()
		}
	}
	_, err := MeasureAenvSnapshot(ctx, opts)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("left behind after cancel: %v", l)
	}
}

func TestMeasureAenvSnapshotWrongCgroupParent(t *testing.T) {
	api := newFakeSnapshotAPI(t)
	opts := api.options()
	opts.Sizes = opts.Sizes[:1]
	opts.CgroupParent = "other"
	_, err := MeasureAenvSnapshot(context.Background(), opts)
	if err == nil || !strings.Contains(err.Error(), "--cgroup-parent") {
		t.Errorf("err = %v, want a hint at --cgroup-parent", err)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("left behind: %v", l)
	}
}

func TestForkIterations(t *testing.T) {
	for _, tt := range []struct{ it, count, want int }{
		{5, 1, 5}, {5, 4, 2}, {5, 16, 1}, {10, 16, 2}, {1, 1, 1}, {1, 16, 1}, {20, 4, 11},
	} {
		if got := forkIterations(tt.it, tt.count); got != tt.want {
			t.Errorf("forkIterations(%d, %d) = %d, want %d", tt.it, tt.count, got, tt.want)
		}
	}
}

func TestDirtyCommandIsValidShellAndPython(t *testing.T) {
	if err := exec.Command("/bin/sh", "-n", "-c", dirtyCommand(256)).Run(); err != nil {
		t.Errorf("sh -n %q: %v", dirtyCommand(256), err)
	}
	if !strings.Contains(dirtyScript(256), "(256 << 20)") {
		t.Errorf("script %q does not allocate 256 MiB", dirtyScript(256))
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 to compile the script with")
	}
	if out, err := exec.Command(py, "-c", "import sys; compile(sys.argv[1], 'dirty', 'exec')", dirtyScript(256)).CombinedOutput(); err != nil {
		t.Errorf("the script does not compile: %v\n%s", err, out)
	}
}

func TestInitArgs(t *testing.T) {
	r := &bareRunner{}
	if got := r.initArgs(0); !slices.Equal(got, []string{"/bin/sleep", "infinity"}) {
		t.Errorf("without envd: %q", got)
	}
	r.opts.EnvdPath = "/x/envd"
	if got := r.initArgs(0); !slices.Equal(got, []string{envdGuestPath, "--port", "49983"}) {
		t.Errorf("with envd: %q", got)
	}
	got := r.initArgs(16)
	if len(got) != 7 || got[0] != "/bin/sh" || got[3] != dirtyScript(16) || got[4] != envdGuestPath {
		t.Errorf("dirty: %q", got)
	}
	// The wrapper must start $0 with python3 and exec the rest: run it
	// with a stand-in python3 that records its argument.
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	stub := "#!/bin/sh\nprintf '%s' \"$2\" > " + out + "\n"
	if err := os.WriteFile(filepath.Join(dir, "python3"), []byte(stub), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(got[0], append(got[1:4], "/bin/true")...)
	cmd.Env = []string{"PATH=" + dir + ":/usr/bin:/bin"}
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("running the wrapper: %v\n%s", err, b)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(out)
		if string(b) == dirtyScript(16) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("python3 got %q, want the script", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// orderSide records the order in which sides are sampled.
type orderSide struct {
	name string
	log  *[]string
	fail string // the step that fails
}

func (o orderSide) take(step string, samples *[]time.Duration) error {
	*o.log = append(*o.log, o.name+" "+step)
	if step == o.fail {
		return errors.New(o.name + " failed " + step)
	}
	*samples = append(*samples, time.Millisecond)
	return nil
}

func (o orderSide) snapshot(ctx context.Context, s *SnapshotSamples) error {
	return o.take("snapshot", &s.Snapshot)
}

func (o orderSide) pauseResume(ctx context.Context, s *SnapshotSamples) error {
	return o.take("pause", &s.Pause)
}

func (o orderSide) fork(ctx context.Context, count int, s *SnapshotSamples) error {
	samples := s.Fork[count]
	err := o.take(fmt.Sprintf("fork%d", count), &samples)
	s.Fork[count] = samples
	return err
}

func TestMeasureSidesInterleavesAndAlternates(t *testing.T) {
	var log []string
	opts := Options{SnapshotIterations: 2, ForkCounts: []int{1, 16}}.withDefaults()
	out, err := measureSides(context.Background(), nil, opts, Size{Name: "s"},
		[]side{orderSide{name: "a", log: &log}, orderSide{name: "b", log: &log}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"b snapshot", "a snapshot", "a snapshot", "b snapshot",
		"b pause", "a pause", "a pause", "b pause",
		"b fork1", "a fork1", "a fork1", "b fork1",
		"b fork16", "a fork16",
	}
	if !slices.Equal(log, want) {
		t.Errorf("order:\n%q\nwant\n%q", log, want)
	}
	for i, s := range out {
		if len(s.Snapshot) != 2 || len(s.Pause) != 2 || len(s.Fork[1]) != 2 || len(s.Fork[16]) != 1 {
			t.Errorf("side %d: %+v", i, s)
		}
	}
}

func TestMeasureSidesStopsAtTheFirstFailure(t *testing.T) {
	var log []string
	opts := Options{SnapshotIterations: 2, ForkCounts: []int{1}}.withDefaults()
	_, err := measureSides(context.Background(), nil, opts, Size{Name: "s"},
		[]side{orderSide{name: "a", log: &log, fail: "pause"}, orderSide{name: "b", log: &log}})
	if err == nil || !strings.Contains(err.Error(), "a failed pause") {
		t.Errorf("err = %v", err)
	}
	if last := log[len(log)-1]; last != "a pause" {
		t.Errorf("went on after the failure: %q", log)
	}
}

// preparedAfter lists a node whose prepared pools of "tpl" (two sizes)
// hold 3 of 3 and 1 of 2 until caughtUp, then 3 and 2; another
// template's prepared pool and tpl's prestarted one hold plenty all along.
type preparedAfter struct{ caughtUp time.Time }

func (p preparedAfter) Nodes(ctx context.Context) ([]client.Node, error) {
	second := 1
	if time.Now().After(p.caughtUp) {
		second = 2
	}
	return []client.Node{{Pool: []client.PoolEntry{
		{TemplateID: "tpl", Ready: 3, Target: 3, Prepared: true},
		{TemplateID: "tpl", Ready: second, Target: 2, Prepared: true},
		{TemplateID: "other", Ready: 50, Target: 50, Prepared: true},
		{TemplateID: "tpl", Ready: 50, Target: 50},
	}}}, nil
}

// TestWaitPrepared: the taught fork waits until the template's prepared
// pools hold the children and each holds what it is sized to, counting
// neither another template's nor the prestarted sandboxes.
func TestWaitPrepared(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	if got := waitPrepared(ctx, newProgress(nil), preparedAfter{caughtUp: start.Add(700 * time.Millisecond)}, "tpl", 4); got != 5 {
		t.Errorf("held %d, want 5", got)
	}
	if d := time.Since(start); d < 700*time.Millisecond || d > 10*time.Second {
		t.Errorf("waited %v for pools caught up after 700ms", d)
	}
	if got := waitPrepared(ctx, newProgress(nil), nil, "tpl", 4); got != -1 {
		t.Errorf("without a node listing: %d, want -1", got)
	}
}
