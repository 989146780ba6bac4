package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// Size is a kind of sandbox the snapshot suite saves and restores.
type Size struct {
	// Name labels the size in the report ("small").
	Name string
	// MemoryMB is the sandbox's memory limit; 0 keeps the template's.
	MemoryMB int
	// DirtyMiB is how much memory a process in the sandbox allocates,
	// writes and keeps before anything is measured; 0 leaves the sandbox
	// as it booted.
	DirtyMiB int
}

// defaultSizes are a fresh base sandbox and one holding 256 MiB of written
// memory, the two ends of what a checkpoint has to save.
func defaultSizes() []Size {
	return []Size{
		{Name: "small"},
		{Name: "256MiB dirty", MemoryMB: 1024, DirtyMiB: 256},
	}
}

// defaultForkCounts are the numbers of children forked at once.
func defaultForkCounts() []int { return []int{1, 4, 16} }

// restoresPerCPU is cluster.RestoresPerCPU (bench may not import the
// cluster): a fork of count children runs min(count, this × the host's
// CPUs) restores at once on a one-node server, and the bare baseline
// restores as many at a time.
const restoresPerCPU = 1

// forkParallelism is how many restores of a fork of count children run at
// once on this host.
func forkParallelism(count int) int {
	return max(1, min(count, restoresPerCPU*goruntime.NumCPU()))
}

// forkIterations is how many times a fork of count children is sampled:
// every restore costs about as much as one more child, so larger forks
// take fewer samples (16 children: once with the default 5 iterations).
func forkIterations(iterations, count int) int {
	return max(1, iterations*4/(count+3))
}

// readyFile is created by the dirty process once all its memory is
// written.
const readyFile = "/tmp/aenv-bench-ready"

// dirtyScript is a Python program that allocates mib MiB, writes every
// byte (a one-byte bytearray repeated is filled with memset, which touches
// every page; the byte is not zero so that no layer can skip the pages as
// empty), says so in readyFile and keeps the memory until killed.
func dirtyScript(mib int) string {
	return "import signal; b = bytearray(b'\\x5a') * (" + strconv.Itoa(mib) + " << 20); " +
		"open('" + readyFile + "', 'w').close(); signal.pause()"
}

// dirtyCommand is the shell command that starts dirtyScript in the
// background of a sandbox, detached from the command that started it.
func dirtyCommand(mib int) string {
	return "nohup setsid python3 -c \"" + dirtyScript(mib) + "\" </dev/null >/dev/null 2>&1 &"
}

// readyTimeout bounds the wait for the dirty process's memory.
const readyTimeout = 2 * time.Minute

// SnapshotAPI is the server under test for the snapshot suite.
type SnapshotAPI interface {
	API
	// Get describes sandbox id in full (its size).
	Get(ctx context.Context, id string) (*client.Sandbox, error)
	// Snapshot saves running sandbox id, which keeps running.
	Snapshot(ctx context.Context, id string) (SnapshotInfo, error)
	// DeleteSnapshot removes a snapshot.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
	// Pause saves sandbox id and stops it.
	Pause(ctx context.Context, id string) error
	// Resume starts paused sandbox id again, alive for timeout seconds;
	// it fails if the sandbox was not paused.
	Resume(ctx context.Context, id string, timeout int) error
	// Fork starts count children of running sandbox id. It returns the
	// children that started even when others did not (the error says
	// which), so that the caller can kill them.
	Fork(ctx context.Context, id string, count, timeout int) ([]*client.Sandbox, error)
}

// SnapshotInfo is what the server says of a new snapshot.
type SnapshotInfo struct {
	SnapshotID string `json:"snapshotID"`
	SizeBytes  int64  `json:"sizeBytes"`
	CPUCount   int    `json:"cpuCount"`
	MemoryMB   int    `json:"memoryMB"`
}

// SnapshotSamples are one size's samples from either half.
type SnapshotSamples struct {
	// Snapshot saves a running sandbox, which keeps running.
	Snapshot []time.Duration
	// Pause saves a sandbox and stops it, releasing its memory.
	Pause []time.Duration
	// Resume brings a paused sandbox back (until the call returns);
	// ResumeCommand adds its first command.
	Resume, ResumeCommand []time.Duration
	// ResumePrepared (bare only) is a restore of the pause's image into a
	// container created ahead (`runsc create`, untimed): the floor of a
	// resume that had its sandbox processes started before it.
	ResumePrepared []time.Duration
	// PauseCPU and ResumeCPU are the host CPU-seconds each pause and
	// resume sample cost (empty where /proc/stat cannot be read).
	PauseCPU, ResumeCPU []float64
	// FromSnapshot starts a new sandbox from a snapshot and runs its first
	// command.
	FromSnapshot []time.Duration
	// Fork is the wall time of a fork, by number of children.
	// ForkTaught (aenv only) is the same for the largest fork once the
	// server's warm pool has prepared sandboxes for its children, as it
	// does after a fork that size (TaughtPrepared is what it held then;
	// -1: unknown): what a loop forking that many each step sees.
	Fork, ForkTaught map[int][]time.Duration
	TaughtPrepared   int
	// MemoryBytes is the running sandbox's memory cgroup usage before
	// the first sample (0 when unknown); ImageBytes the size of a saved
	// image of it.
	MemoryBytes, ImageBytes int64
}

// SizeSamples pairs a size with its samples.
type SizeSamples struct {
	Size    Size
	Samples SnapshotSamples
}

// SnapshotResults are what the snapshot suite measured.
type SnapshotResults struct {
	// Aenv and Bare are in the order of Options.Sizes; either is empty
	// when its half did not run.
	Aenv, Bare []SizeSamples
	// Memory is the pause memory measurement; nil if skipped.
	Memory *MemoryResults
}

// side is one half of the snapshot suite, aenv or bare runsc, with one
// running sandbox of a size. Each method takes one sample into s.
type side interface {
	snapshot(ctx context.Context, s *SnapshotSamples) error
	pauseResume(ctx context.Context, s *SnapshotSamples) error
	fork(ctx context.Context, count int, s *SnapshotSamples) error
}

// measureSides runs the suite's samples on sides, taking each sample on
// every side before the next one, so that both halves see the same load
// on the host (a benchmark on a shared host drifts over minutes). Which
// side goes first alternates, so that neither always follows the other's
// writes. It returns one SnapshotSamples per side.
func measureSides(ctx context.Context, p *progress, opts Options, size Size, sides []side) ([]SnapshotSamples, error) {
	out := make([]SnapshotSamples, len(sides))
	for i := range out {
		out[i].Fork, out[i].ForkTaught = map[int][]time.Duration{}, map[int][]time.Duration{}
	}
	each := func(i int, f func(side, *SnapshotSamples) error) error {
		for k := range sides {
			j := (k + i) % len(sides)
			if err := f(sides[j], &out[j]); err != nil {
				return err
			}
		}
		return nil
	}
	n := opts.SnapshotIterations
	steps := []struct {
		label string
		n     int
		f     func(side, *SnapshotSamples) error
	}{
		{"snapshot", n, func(s side, x *SnapshotSamples) error { return s.snapshot(ctx, x) }},
		{"pause/resume", n, func(s side, x *SnapshotSamples) error { return s.pauseResume(ctx, x) }},
	}
	for _, count := range opts.ForkCounts {
		steps = append(steps, struct {
			label string
			n     int
			f     func(side, *SnapshotSamples) error
		}{fmt.Sprintf("fork %d", count), forkIterations(n, count), func(s side, x *SnapshotSamples) error { return s.fork(ctx, count, x) }})
	}
	for _, st := range steps {
		i := 0
		err := repeat(ctx, p, st.label+" "+size.Name, st.n, func(ctx context.Context) error {
			i++
			return each(i, st.f)
		})
		if err != nil {
			return out, fmt.Errorf("%s: %w", st.label, err)
		}
	}
	if count := slices.Max(append([]int{0}, opts.ForkCounts...)); count > 1 {
		for i, sd := range sides {
			if t, ok := sd.(taughtForker); ok {
				if err := t.forkTaught(ctx, p, count, &out[i]); err != nil {
					return out, fmt.Errorf("fork %d, pool taught: %w", count, err)
				}
			}
		}
	}
	return out, nil
}

// taughtForker is a side with a warm pool that prepares sandboxes for
// restores (aenv's; bare runsc has none).
type taughtForker interface {
	// forkTaught waits for the pool to have prepared for count children
	// (the fork samples taught it), then takes one fork sample into
	// s.ForkTaught.
	forkTaught(ctx context.Context, p *progress, count int, s *SnapshotSamples) error
}

// MeasureAenvSnapshot measures, through the server alone, snapshot,
// pause, resume, create from a snapshot and fork for each of opts.Sizes,
// then what pausing opts.PauseCount small sandboxes frees. Every sandbox
// and snapshot it creates is removed before it returns, also on error.
func MeasureAenvSnapshot(ctx context.Context, opts Options) (SnapshotResults, error) {
	opts = opts.withDefaults()
	if opts.Snapshots == nil {
		return SnapshotResults{}, errors.New("measuring aenv snapshots: no API client")
	}
	p := newProgress(opts.Progress)
	var res SnapshotResults
	for _, size := range opts.Sizes {
		s, err := measureAenvSize(ctx, p, opts, size)
		if err != nil {
			return res, fmt.Errorf("measuring aenv snapshots, %s: %w", size.Name, err)
		}
		res.Aenv = append(res.Aenv, SizeSamples{Size: size, Samples: s})
	}
	if err := measureMemory(ctx, p, opts, &res); err != nil {
		return res, err
	}
	return res, nil
}

func measureAenvSize(ctx context.Context, p *progress, opts Options, size Size) (_ SnapshotSamples, err error) {
	a, err := newAenvSide(ctx, p, opts, size)
	if err != nil {
		return SnapshotSamples{}, err
	}
	defer func() {
		if kerr := runCleanups(ctx, a.kill); kerr != nil {
			err = errors.Join(err, kerr)
		}
	}()
	out, err := measureSides(ctx, p, opts, size, []side{a})
	out[0].MemoryBytes = a.memoryBytes
	return out[0], err
}

// measureMemory runs measurePauseMemory into res unless opts skip it.
func measureMemory(ctx context.Context, p *progress, opts Options, res *SnapshotResults) error {
	if opts.PauseCount <= 0 {
		return nil
	}
	m, err := measurePauseMemory(ctx, p, opts)
	if err != nil {
		return fmt.Errorf("measuring aenv snapshots: %w", err)
	}
	res.Memory = &m
	return nil
}

// aenvSandbox is a sandbox the snapshot suite created.
type aenvSandbox struct {
	api SnapshotAPI
	sb  *client.Sandbox
}

// kill is the sandbox's cleanup.
func (s aenvSandbox) kill(ctx context.Context) error {
	return s.api.Kill(ctx, s.sb.SandboxID)
}

// runTrue times `true` in the sandbox.
func (s aenvSandbox) runTrue(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	err := runTrue(ctx, s.api, s.sb)
	return time.Since(start), err
}

// createSized creates a sandbox of size and, for a dirty size, waits until
// its process has written all its memory. On error nothing is left.
func createSized(ctx context.Context, opts Options, size Size) (aenvSandbox, error) {
	sb, err := opts.Snapshots.Create(ctx, client.CreateOptions{TemplateID: opts.Template, Timeout: sandboxTimeout, MemoryMB: size.MemoryMB})
	if err != nil {
		return aenvSandbox{}, err
	}
	s := aenvSandbox{api: opts.Snapshots, sb: sb}
	if err := dirty(ctx, s, size.DirtyMiB); err != nil {
		return aenvSandbox{}, errors.Join(err, runCleanups(ctx, s.kill))
	}
	return s, nil
}

// dirty starts the process that holds mib MiB in s and waits for it.
func dirty(ctx context.Context, s aenvSandbox, mib int) error {
	if mib <= 0 {
		return nil
	}
	opts := client.RunOptions{AccessToken: s.sb.EnvdAccessToken}
	if code, err := s.api.Run(ctx, s.sb.SandboxID, dirtyCommand(mib), opts); err != nil || code != 0 {
		return fmt.Errorf("starting the %d MiB process in %s: %w (exit %d)", mib, s.sb.SandboxID, err, code)
	}
	return poll(ctx, readyTimeout, func(ctx context.Context) (bool, error) {
		code, err := s.api.Run(ctx, s.sb.SandboxID, "test -e "+readyFile, opts)
		return err == nil && code == 0, err
	})
}

// poll calls done every pollInterval until it reports true, fails, or
// timeout passes.
func poll(ctx context.Context, timeout time.Duration, done func(context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, err := done(ctx)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the dirty process: %w", ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

const pollInterval = 100 * time.Millisecond

// aenvSide is the aenv half of the suite, on one sandbox.
type aenvSide struct {
	aenvSandbox
	opts Options
	// cpus and memoryMB are the sandbox's size as the server tells it;
	// memoryBytes its cgroup's usage once ready.
	cpus, memoryMB int
	memoryBytes    int64
}

// newAenvSide creates the sandbox of size the aenv half works on; the
// caller kills it.
func newAenvSide(ctx context.Context, p *progress, opts Options, size Size) (*aenvSide, error) {
	p.start("creating "+size.Name, 1)
	s, err := createSized(ctx, opts, size)
	p.end()
	if err != nil {
		return nil, err
	}
	a := &aenvSide{aenvSandbox: s, opts: opts}
	a.cpus, a.memoryMB = sandboxSize(ctx, opts.Snapshots, s.sb)
	a.memoryBytes, _ = cgroupMemory(opts.cgroupRoot, opts.CgroupParent, s.sb.SandboxID)
	return a, nil
}

// snapshot times a snapshot, then a new sandbox from it to its first
// command.
func (a *aenvSide) snapshot(ctx context.Context, res *SnapshotSamples) error {
	api := a.opts.Snapshots
	start := time.Now()
	info, err := api.Snapshot(ctx, a.sb.SandboxID)
	if err != nil {
		return err
	}
	res.Snapshot = append(res.Snapshot, time.Since(start))
	res.ImageBytes = info.SizeBytes
	del := func(ctx context.Context) error { return api.DeleteSnapshot(ctx, info.SnapshotID) }

	start = time.Now()
	child, err := api.Create(ctx, client.CreateOptions{TemplateID: info.SnapshotID, Timeout: sandboxTimeout})
	if err != nil {
		return errors.Join(err, runCleanups(ctx, del))
	}
	c := aenvSandbox{api: api, sb: child}
	if err := runTrue(ctx, c.api, c.sb); err != nil {
		return errors.Join(err, runCleanups(ctx, c.kill, del))
	}
	res.FromSnapshot = append(res.FromSnapshot, time.Since(start))
	return runCleanups(ctx, c.kill, del)
}

// pauseResume times a pause, then a resume and its first command.
func (a *aenvSide) pauseResume(ctx context.Context, res *SnapshotSamples) error {
	api, id := a.opts.Snapshots, a.sb.SandboxID
	start, cpu := time.Now(), startCPU()
	if err := api.Pause(ctx, id); err != nil {
		return err
	}
	res.Pause = append(res.Pause, time.Since(start))
	res.PauseCPU = cpu.sample(res.PauseCPU)
	start, cpu = time.Now(), startCPU()
	if err := api.Resume(ctx, id, sandboxTimeout); err != nil {
		return err
	}
	resumed := time.Since(start)
	res.ResumeCPU = cpu.sample(res.ResumeCPU)
	cmd, err := a.runTrue(ctx)
	if err != nil {
		return err
	}
	res.Resume = append(res.Resume, resumed)
	res.ResumeCommand = append(res.ResumeCommand, resumed+cmd)
	return nil
}

// fork times a fork of count children; one of them must then answer a
// command (untimed). The children are killed before it returns.
func (a *aenvSide) fork(ctx context.Context, count int, res *SnapshotSamples) error {
	api := a.opts.Snapshots
	start := time.Now()
	children, err := api.Fork(ctx, a.sb.SandboxID, count, sandboxTimeout)
	d := time.Since(start)
	kills := make([]cleanup, len(children))
	for i, c := range children {
		kills[i] = aenvSandbox{api: api, sb: c}.kill
	}
	if err == nil && len(children) != count {
		err = fmt.Errorf("forked %d children, want %d", len(children), count)
	}
	if err == nil {
		_, err = aenvSandbox{api: api, sb: children[len(children)-1]}.runTrue(ctx)
	}
	if err == nil {
		res.Fork[count] = append(res.Fork[count], d)
	}
	return errors.Join(err, runCleanups(ctx, kills...))
}

// forkTaught implements taughtForker. The wait is untimed and bounded by
// poolWait; a pool that has not caught up by then is forked from as it
// is, and TaughtPrepared says what it held.
func (a *aenvSide) forkTaught(ctx context.Context, p *progress, count int, res *SnapshotSamples) error {
	nodes, _ := a.opts.Snapshots.(nodeLister)
	// The nodes list pools by template id; opts.Template may be an alias.
	template := cmp.Or(a.sb.TemplateID, a.opts.Template)
	res.TaughtPrepared = waitPrepared(ctx, p, nodes, template, count)
	forked := SnapshotSamples{Fork: map[int][]time.Duration{}}
	if err := a.fork(ctx, count, &forked); err != nil {
		return err
	}
	res.ForkTaught[count] = forked.Fork[count]
	return nil
}

// waitPrepared waits, at most poolWait, until the nodes hold want
// prepared sandboxes of template and as many as their pools of them (one
// per size) are sized to, and returns how many they hold (-1: the API
// cannot say).
func waitPrepared(ctx context.Context, p *progress, api nodeLister, template string, want int) int {
	return waitPoolUntil(ctx, p, api, template, true, "waiting for the pool to prepare", want, func(ready, target int) bool {
		return ready >= want && ready >= target
	})
}

// repeat runs f n times, one after another, showing progress, and stops at
// the first error.
func repeat(ctx context.Context, p *progress, label string, n int, f func(context.Context) error) error {
	p.start(label, n)
	defer p.end()
	for i := range n {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := f(ctx); err != nil {
			return fmt.Errorf("sample %d: %w", i+1, err)
		}
		p.update(i + 1)
	}
	return nil
}

// measurePauseMemory creates opts.PauseCount small sandboxes, pauses them
// all and resumes them all, reading the host's memory and the sandboxes'
// cgroups at each stage, and checks that paused sandboxes keep no cgroup
// and no process.
func measurePauseMemory(ctx context.Context, p *progress, opts Options) (res MemoryResults, err error) {
	n := opts.PauseCount
	res.Sandboxes = n
	var sandboxes []aenvSandbox
	defer func() {
		kills := make([]cleanup, len(sandboxes))
		for i, s := range sandboxes {
			kills[i] = s.kill
		}
		if kerr := runCleanups(ctx, kills...); kerr != nil {
			err = errors.Join(err, fmt.Errorf("memory: %w", kerr))
		}
	}()
	err = repeat(ctx, p, "memory: creating", n, func(ctx context.Context) error {
		s, err := createSized(ctx, opts, Size{Name: "small"})
		if err != nil {
			return err
		}
		sandboxes = append(sandboxes, s)
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("memory: creating: %w", err)
	}
	ids := make([]string, n)
	for i, s := range sandboxes {
		ids[i] = s.sb.SandboxID
	}
	read := func() (MemorySample, error) {
		// Let the server's warm pool refill and the kernel settle first.
		select {
		case <-ctx.Done():
			return MemorySample{}, ctx.Err()
		case <-time.After(opts.settle):
		}
		return sampleMemory(opts.cgroupRoot, opts.CgroupParent, opts.procRoot, ids)
	}
	if res.Running, err = read(); err != nil {
		return res, fmt.Errorf("memory: %w", err)
	}
	if res.Running.Cgroups != n {
		return res, fmt.Errorf("memory: %d of %d running sandboxes have a cgroup under %s: is --cgroup-parent the server's --netns-tag?",
			res.Running.Cgroups, n, filepath.Join(opts.cgroupRoot, opts.CgroupParent))
	}
	err = repeat(ctx, p, "memory: pausing", n, func(ctx context.Context) error {
		start := time.Now()
		if err := opts.Snapshots.Pause(ctx, ids[len(res.Pause)]); err != nil {
			return err
		}
		res.Pause = append(res.Pause, time.Since(start))
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("memory: pausing: %w", err)
	}
	if res.Paused, err = read(); err != nil {
		return res, fmt.Errorf("memory: %w", err)
	}
	res.LeftProcesses, err = processesNaming(ids)
	if err != nil {
		return res, fmt.Errorf("memory: %w", err)
	}
	err = repeat(ctx, p, "memory: resuming", n, func(ctx context.Context) error {
		start := time.Now()
		if err := opts.Snapshots.Resume(ctx, ids[len(res.Resume)], sandboxTimeout); err != nil {
			return err
		}
		res.Resume = append(res.Resume, time.Since(start))
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("memory: resuming: %w", err)
	}
	if res.Resumed, err = read(); err != nil {
		return res, fmt.Errorf("memory: %w", err)
	}
	return res, nil
}

// memorySettle is the pause before each memory reading.
const memorySettle = 2 * time.Second
