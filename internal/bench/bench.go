// Package bench measures what a sandbox costs through aenv (create to first
// command, command round trip; snapshot, pause, resume and fork) and what
// the same work costs with bare runsc on the same root filesystem and
// flags, so that aenv's own overhead is a ratio rather than a guess. Only
// the CLI (`aenv bench`) and its tests import it.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// Defaults for Options.
const (
	DefaultIterations  = 20
	DefaultConcurrency = 10
	DefaultTemplate    = "base"
	// DefaultBurstSize is the burst `aenv bench` starts at once, as RL
	// training does, and DefaultSustainFor how long it keeps creating.
	DefaultBurstSize  = 50
	DefaultSustainFor = 15 * time.Second
	// DefaultSnapshotIterations is low because every sample of the
	// snapshot suite saves or restores a whole sandbox.
	DefaultSnapshotIterations = 5
	// DefaultPauseCount is how many sandboxes the memory measurement
	// pauses at once.
	DefaultPauseCount = 20
	// DefaultCgroupParent is the server's default --netns-tag, under which
	// its sandboxes' cgroups live.
	DefaultCgroupParent = "aenv"
)

// Options configures both halves of a benchmark; each half reads the fields
// it needs.
type Options struct {
	// Iterations is the number of samples per operation (default 20). The
	// concurrent operation takes max(1, Iterations/Concurrency) rounds.
	Iterations int
	// Concurrency is how many sandboxes start at once in the concurrent
	// operation (default 10), and how many clients the sustained rate
	// runs.
	Concurrency int
	// BurstSize is how many sandboxes the bursts start at once (0: no
	// bursts; the CLI's default is DefaultBurstSize).
	BurstSize int
	// SustainFor is how long the sustained create rate is measured (0:
	// not measured; the CLI's default is DefaultSustainFor).
	SustainFor time.Duration

	// API is the server under test (aenv half).
	API API
	// Template is the template sandboxes are created from (default base).
	Template string

	// RunscPath and RootFS are the runsc binary and the template's root
	// filesystem the bare baseline runs (bare half).
	RunscPath string
	RootFS    string
	// FastPath is the server's --systrap-fast-path (auto, on or off),
	// which the bare baseline runs with too (empty: auto).
	FastPath string
	// CPUCount and MemoryMB size the bare containers' cgroups like the
	// template's sandboxes (0: no limit).
	CPUCount, MemoryMB int

	// SnapshotIterations is the number of samples per snapshot-suite
	// operation (default 5); the larger forks take fewer (forkIterations).
	SnapshotIterations int
	// Sizes are the sandbox sizes the snapshot suite measures (default: a
	// fresh base sandbox, "small", and one whose process holds 256 MiB it
	// wrote, "256MiB dirty").
	Sizes []Size
	// ForkCounts are the numbers of children forked at once (default 1,
	// 4, 16).
	ForkCounts []int
	// PauseCount is how many small sandboxes the memory measurement
	// pauses (default 20; negative skips it).
	PauseCount int
	// CgroupParent is the server's cgroup parent (its --netns-tag, default
	// aenv): sandbox id's memory cgroup is
	// /sys/fs/cgroup/memory/<CgroupParent>/<id>.
	CgroupParent string
	// Snapshots is the server under test for the snapshot suite (aenv
	// half).
	Snapshots SnapshotAPI
	// EnvdPath, when set, is the envd binary the bare snapshot baseline
	// runs as its containers' first process, like aenv's sandboxes, so
	// that both save and restore the same processes; empty runs sleep.
	EnvdPath string

	// Progress receives a progress line (rewritten with \r) while a
	// measurement runs; nil means silent.
	Progress io.Writer
	// Notes receives, a line each, what a reader of the figures should
	// know about how they were taken (a wait for the host to go quiet
	// before a bare baseline, or a baseline read on a busy host); nil
	// discards them.
	Notes io.Writer

	// settle is the pause before each memory reading (default
	// memorySettle), cgroupRoot the memory cgroup hierarchy (default
	// /sys/fs/cgroup/memory) and procRoot /proc; tests shorten and move
	// them. quietWithin bounds the wait for a quiet host before a bare
	// baseline (default quietWait); tests on a busy host shorten it.
	settle, quietWithin  time.Duration
	cgroupRoot, procRoot string
}

func (o Options) withDefaults() Options {
	if o.Iterations <= 0 {
		o.Iterations = DefaultIterations
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Template == "" {
		o.Template = DefaultTemplate
	}

	if o.SnapshotIterations <= 0 {
		o.SnapshotIterations = DefaultSnapshotIterations
	}
	if len(o.Sizes) == 0 {
		o.Sizes = defaultSizes()
	}
	if len(o.ForkCounts) == 0 {
		o.ForkCounts = defaultForkCounts()
	}
	if o.PauseCount == 0 {
		o.PauseCount = DefaultPauseCount
	}
	if o.CgroupParent == "" {
		o.CgroupParent = DefaultCgroupParent
	}
	if o.settle == 0 {
		o.settle = memorySettle
	}
	if o.quietWithin == 0 {
		o.quietWithin = quietWait
	}
	if o.cgroupRoot == "" {
		o.cgroupRoot = cgroupRoot
	}
	if o.procRoot == "" {
		o.procRoot = procRoot
	}
	return o
}

// rounds is the number of concurrent rounds: enough for about Iterations
// samples, at least one, and always full so that every sample saw the same
// concurrency.
func (o Options) rounds() int {
	return max(1, o.Iterations/o.Concurrency)
}

// API is the part of the aenv client the benchmark drives; *client.Client
// implements it.
type API interface {
	Create(ctx context.Context, opts client.CreateOptions) (*client.Sandbox, error)
	Run(ctx context.Context, id, cmd string, opts client.RunOptions) (int, error)
	Kill(ctx context.Context, id string) error
}

var _ API = (*client.Client)(nil)

// op is one timed operation: it returns how long the timed part took and a
// cleanup that runs untimed (after the whole round, so that tearing one
// sandbox down does not slow the others' start). cleanup may be nil, and is
// returned even with an error when there is something to clean up.
type op func(ctx context.Context) (d time.Duration, cleanup cleanup, err error)

// commandGap is the untimed pause before each command of the spaced
// round trip: an agent's commands come between its model's turns, not
// back to back, and envd prepares for the next command after each.
const commandGap = 100 * time.Millisecond

// spaced is o after an untimed pause of gap.
func spaced(gap time.Duration, o op) op {
	return func(ctx context.Context) (time.Duration, cleanup, error) {
		select {
		case <-time.After(gap):
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
		return o(ctx)
	}
}

// cleanup undoes what an op left running.
type cleanup func(context.Context) error

// cleanupTimeout bounds the untimed teardown, which still runs after the
// benchmark's context is cancelled.
const cleanupTimeout = time.Minute

// commandSettle is how long a command series waits after its last sample
// before it reads the host's CPU: envd starts the next ready shell as a
// command ends (two thirds of a command's cost here), and that work is
// the last command's.
const commandSettle = 500 * time.Millisecond

// cpuSeries is series of n samples one at a time, which also returns the
// host CPU-seconds a sample cost: read from the first timed sample's start
// to settle after the last one, so that work a sample leaves running is
// counted (the host must be otherwise idle).
func cpuSeries(ctx context.Context, p *progress, label string, warmup, n int, settle time.Duration, o op) ([]time.Duration, float64, error) {
	var cpu cpuMeter
	calls := 0
	counted := func(ctx context.Context) (time.Duration, cleanup, error) {
		if calls == warmup {
			cpu = startCPU()
		}
		calls++
		return o(ctx)
	}
	durs, err := series(ctx, p, label, warmup, n, 1, counted)
	if err != nil {
		return nil, 0, err
	}
	select {
	case <-ctx.Done():
		return nil, 0, fmt.Errorf("%s: %w", label, ctx.Err())
	case <-time.After(settle):
	}
	return durs, cpu.per(len(durs)), nil
}

// series runs o rounds times, conc at once, after warmup untimed runs, and
// returns the rounds*conc durations. The first error ends the series once
// the round it happened in is cleaned up.
func series(ctx context.Context, p *progress, label string, warmup, rounds, conc int, o op) ([]time.Duration, error) {
	total := rounds * conc
	p.start(label, total)
	defer p.end()
	for i := range warmup {
		_, c, err := o(ctx)
		if err = errors.Join(err, runCleanups(ctx, c)); err != nil {
			return nil, fmt.Errorf("%s: warm-up %d: %w", label, i+1, err)
		}
	}
	out := make([]time.Duration, 0, total)
	for r := range rounds {
		durs := make([]time.Duration, conc)
		errs := make([]error, conc)
		cleanups := make([]cleanup, conc)
		var wg sync.WaitGroup
		var mu sync.Mutex
		done := len(out)
		gate := make(chan struct{})
		for i := range conc {
			wg.Go(func() {
				<-gate
				durs[i], cleanups[i], errs[i] = o(ctx)
				mu.Lock()
				done++
				p.update(done)
				mu.Unlock()
			})
		}
		close(gate)
		wg.Wait()
		cerr := runCleanups(ctx, cleanups...)
		for i, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("%s: round %d, sample %d: %w", label, r+1, i+1, errors.Join(err, cerr))
			}
		}
		if cerr != nil {
			return nil, fmt.Errorf("%s: round %d: %w", label, r+1, cerr)
		}
		out = append(out, durs...)
	}
	return out, nil
}

// runN runs job n times, conc at once, handing out no more once ctx ends,
// and returns when every job it started has.
func runN(ctx context.Context, n, conc int, job func()) {
	work := make(chan struct{})
	var wg sync.WaitGroup
	for range max(min(conc, n), 1) {
		wg.Go(func() {
			for range work {
				job()
			}
		})
	}
feed:
	for range n {
		select {
		case work <- struct{}{}:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
}

// runCleanups runs every cleanup, even after ctx is cancelled (a benchmark
// interrupted with Ctrl-C must still leave nothing running), one after
// another so that they do not compete with each other, each within
// cleanupTimeout (a thousand kills take longer than one would).
func runCleanups(ctx context.Context, cleanups ...cleanup) error {
	var errs []error
	for _, c := range cleanups {
		if c != nil {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			errs = append(errs, c(cctx))
			cancel()
		}
	}
	return errors.Join(errs...)
}

// progress rewrites one line on w: "label: done/total". A nil *progress or
// nil w prints nothing.
type progress struct {
	w            io.Writer
	label        string
	total, width int
}

func newProgress(w io.Writer) *progress { return &progress{w: w} }

func (p *progress) start(label string, total int) {
	if p == nil {
		return
	}
	p.label, p.total = label, total
	p.update(0)
}

func (p *progress) update(done int) {
	if p == nil || p.w == nil {
		return
	}
	line := fmt.Sprintf("%s: %d/%d", p.label, done, p.total)
	if p.total == 0 { // a count with no end known
		line = fmt.Sprintf("%s: %d", p.label, done)
	}
	pad := max(0, p.width-len(line))
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
}

// end blanks the line so that whatever is printed next starts clean.
func (p *progress) end() {
	if p == nil || p.w == nil || p.width == 0 {
		return
	}
	fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", p.width))
	p.width = 0
}

// errNonZero is returned when the benchmark's trivial command fails, which
// would make its timing meaningless.
var errNonZero = errors.New("command exited non-zero")
