package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

func TestSeriesRunsFullConcurrentRoundsAndCleansUpBetween(t *testing.T) {
	var inFlight, maxInFlight, cleaned atomic.Int32
	var mu sync.Mutex
	var events []string
	o := func(ctx context.Context) (time.Duration, cleanup, error) {
		n := inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		time.Sleep(20 * time.Millisecond)
		inFlight.Add(-1)
		return time.Millisecond, func(context.Context) error {
			if inFlight.Load() != 0 {
				t.Error("cleanup ran while a timed operation was in flight")
			}
			cleaned.Add(1)
			mu.Lock()
			events = append(events, "cleanup")
			mu.Unlock()
			return nil
		}, nil
	}
	var buf bytes.Buffer
	got, err := series(context.Background(), newProgress(&buf), "x c=4", 1, 3, 4, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 12 {
		t.Errorf("got %d samples, want 3 rounds x 4", len(got))
	}
	if m := maxInFlight.Load(); m != 4 {
		t.Errorf("at most %d ran at once, want 4", m)
	}
	if c := cleaned.Load(); c != 13 {
		t.Errorf("%d cleanups, want 13 (12 samples + 1 warm-up)", c)
	}
	if !strings.Contains(buf.String(), "x c=4: 12/12") {
		t.Errorf("progress never reached 12/12: %q", buf.String())
	}
	if !strings.HasSuffix(buf.String(), "\r") {
		t.Errorf("progress line not blanked at the end: %q", buf.String())
	}
}

func TestSeriesErrorStillCleansUpTheRound(t *testing.T) {
	var calls, cleaned atomic.Int32
	boom := errors.New("boom")
	o := func(ctx context.Context) (time.Duration, cleanup, error) {
		c := func(context.Context) error { cleaned.Add(1); return nil }
		if calls.Add(1) == 2 {
			return 0, c, boom
		}
		return time.Millisecond, c, nil
	}
	_, err := series(context.Background(), nil, "x", 0, 5, 3, o)
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v, want boom", err)
	}
	if calls.Load() != 3 || cleaned.Load() != 3 {
		t.Errorf("calls=%d cleaned=%d, want the failed round (3) run and cleaned, and no more", calls.Load(), cleaned.Load())
	}
}

func TestSeriesReportsCleanupFailure(t *testing.T) {
	o := func(ctx context.Context) (time.Duration, cleanup, error) {
		return time.Millisecond, func(context.Context) error { return errors.New("still running") }, nil
	}
	if _, err := series(context.Background(), nil, "x", 0, 1, 1, o); err == nil || !strings.Contains(err.Error(), "still running") {
		t.Errorf("err = %v, want the cleanup's failure", err)
	}
}

func TestRounds(t *testing.T) {
	for _, tt := range []struct{ it, conc, want int }{{20, 10, 2}, {25, 10, 2}, {2, 10, 1}, {100, 10, 10}, {3, 1, 3}} {
		if got := (Options{Iterations: tt.it, Concurrency: tt.conc}).rounds(); got != tt.want {
			t.Errorf("rounds(%d, %d) = %d, want %d", tt.it, tt.conc, got, tt.want)
		}
	}
}

// fakeAPI is a server whose sandboxes take a few milliseconds to create.
type fakeAPI struct {
	mu      sync.Mutex
	seq     int
	live    map[string]bool
	created int
	runs    int
	// exitCode is what `true` returns; failRun makes Run fail instead.
	exitCode int
	failRun  error
	// onCreate, if set, runs inside Create (e.g. to cancel the context).
	onCreate func()
}

func newFakeAPI() *fakeAPI { return &fakeAPI{live: map[string]bool{}} }

func (f *fakeAPI) Create(ctx context.Context, opts client.CreateOptions) (*client.Sandbox, error) {
	if opts.TemplateID != "tpl" || opts.Timeout <= 0 {
		return nil, fmt.Errorf("bad create options %+v", opts)
	}
	if f.onCreate != nil {
		f.onCreate()
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	time.Sleep(2 * time.Millisecond)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	f.created++
	id := fmt.Sprintf("sb%d", f.seq)
	f.live[id] = true
	return &client.Sandbox{SandboxID: id, EnvdAccessToken: "tok-" + id, CPUCount: 2, MemoryMB: 512}, nil
}

func (f *fakeAPI) Run(ctx context.Context, id, cmd string, opts client.RunOptions) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs++
	if !f.live[id] {
		return -1, fmt.Errorf("run in unknown sandbox %s", id)
	}
	if cmd != "true" || opts.AccessToken != "tok-"+id {
		return -1, fmt.Errorf("bad run %q %+v", cmd, opts)
	}
	if f.failRun != nil {
		return -1, f.failRun
	}
	return f.exitCode, nil
}

func (f *fakeAPI) Kill(ctx context.Context, id string) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.live[id] {
		return fmt.Errorf("kill of unknown sandbox %s", id)
	}
	delete(f.live, id)
	return nil
}

func (f *fakeAPI) leaked() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for id := range f.live {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func TestMeasureAenv(t *testing.T) {
	api := newFakeAPI()
	res, err := MeasureAenv(context.Background(), Options{API: api, Template: "tpl", Iterations: 6, Concurrency: 3, quietWithin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.CreateSerial) != 6 || len(res.CreateConcurrent) != 6 || len(res.CreateBackToBack) != 6 || len(res.Command) != 6 {
		t.Errorf("samples: serial %d, concurrent %d, back to back %d, command %d; want 6 each",
			len(res.CreateSerial), len(res.CreateConcurrent), len(res.CreateBackToBack), len(res.Command))
	}
	for _, d := range slices.Concat(res.CreateSerial, res.CreateConcurrent, res.CreateBackToBack) {
		if d < 2*time.Millisecond {
			t.Errorf("create sample %v shorter than the create itself", d)
		}
	}
	if res.CPUCount != 2 || res.MemoryMB != 512 {
		t.Errorf("size = %d CPUs, %d MiB; want the server's 2, 512", res.CPUCount, res.MemoryMB)
	}
	// 1 warm-up + 6 serial + 6 concurrent + 1 for the command series + 6
	// back to back.
	if api.created != 20 {
		t.Errorf("created %d sandboxes, want 20", api.created)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("sandboxes left running: %v", l)
	}
}

// TestMeasureAenvBurstsAndRate: the bursts start BurstSize sandboxes at
// once, twice; the sustained rate counts the creates done in SustainFor;
// all are killed.
func TestMeasureAenvBurstsAndRate(t *testing.T) {
	api := newFakeAPI()
	res, err := MeasureAenv(context.Background(), Options{API: api, Template: "tpl", Iterations: 2, Concurrency: 2,
		BurstSize: 5, SustainFor: 200 * time.Millisecond, quietWithin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Burst) != 5 || len(res.BurstPooled) != 5 {
		t.Errorf("bursts of %d and %d samples, want 5 each", len(res.Burst), len(res.BurstPooled))
	}
	if res.PoolBefore != -1 || res.PoolTaught != -1 || res.PoolConcurrent != -1 {
		t.Errorf("pool %d, %d then %d through an API that lists no nodes, want -1 (unknown)", res.PoolConcurrent, res.PoolBefore, res.PoolTaught)
	}
	// A create takes 2 ms on the fake: two clients do at most 1,000 a
	// second.
	if res.CreatesPerSecond <= 0 || res.CreatesPerSecond > 1000 {
		t.Errorf("sustained %.1f creates/s, want between 0 and 1000", res.CreatesPerSecond)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("sandboxes left running: %v", l)
	}
}

func TestMeasureAenvFailsOnNonZeroExitAndKillsEverything(t *testing.T) {
	api := newFakeAPI()
	api.exitCode = 1
	_, err := MeasureAenv(context.Background(), Options{API: api, Template: "tpl", Iterations: 2, Concurrency: 2, quietWithin: time.Second})
	if !errors.Is(err, errNonZero) {
		t.Errorf("err = %v, want a non-zero exit error", err)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("sandboxes left running: %v", l)
	}
}

func TestMeasureAenvCommandFailureKillsItsSandbox(t *testing.T) {
	api := newFakeAPI()
	opts := Options{API: api, Template: "tpl", Iterations: 2, Concurrency: 2, quietWithin: time.Second}
	// The sandbox is created, then every Run in it fails.
	p := newProgress(nil)
	api.failRun = errors.New("proxy down")
	if _, _, _, err := measureCommand(context.Background(), p, opts.withDefaults()); err == nil || !strings.Contains(err.Error(), "proxy down") {
		t.Errorf("err = %v, want the run failure", err)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("sandboxes left running: %v", l)
	}
}

func TestMeasureAenvCancelledStillKills(t *testing.T) {
	api := newFakeAPI()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var n atomic.Int32
	api.onCreate = func() {
		if n.Add(1) == 4 {
			cancel()
		}
	}
	_, err := MeasureAenv(ctx, Options{API: api, Template: "tpl", Iterations: 10, Concurrency: 5, quietWithin: time.Second})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if l := api.leaked(); len(l) > 0 {
		t.Errorf("sandboxes left running after cancel: %v", l)
	}
}

// sizelessAPI answers creates without the size, as E2B's create does, and
// tells it on Get.
type sizelessAPI struct{ *fakeAPI }

func (s sizelessAPI) Create(ctx context.Context, opts client.CreateOptions) (*client.Sandbox, error) {
	sb, err := s.fakeAPI.Create(ctx, opts)
	if sb != nil {
		sb.CPUCount, sb.MemoryMB = 0, 0
	}
	return sb, err
}

func (s sizelessAPI) Get(ctx context.Context, id string) (*client.Sandbox, error) {
	return &client.Sandbox{SandboxID: id, CPUCount: 3, MemoryMB: 768}, nil
}

func TestMeasureAenvAsksForTheSizeTheCreateAnswerLacks(t *testing.T) {
	api := sizelessAPI{newFakeAPI()}
	res, err := MeasureAenv(context.Background(), Options{API: api, Template: "tpl", Iterations: 1, Concurrency: 1, quietWithin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.CPUCount != 3 || res.MemoryMB != 768 {
		t.Errorf("size = %d CPUs, %d MiB; want Get's 3, 768", res.CPUCount, res.MemoryMB)
	}
}

// TestMeasureAenvSaysWhatThePoolHeld: the concurrent series records how
// many sandboxes the pool held prestarted when it began (an earlier run's
// burst may have taught it to hold that many).
func TestMeasureAenvSaysWhatThePoolHeld(t *testing.T) {
	api := struct {
		*fakeAPI
		*poolAfter
	}{newFakeAPI(), &poolAfter{target: 3}}
	res, err := MeasureAenv(context.Background(), Options{API: api, Template: "tpl", Iterations: 2, Concurrency: 2, quietWithin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if res.PoolConcurrent != 3 {
		t.Errorf("pool before the concurrent series = %d, want the node's 3", res.PoolConcurrent)
	}
}

// poolAfter is a node lister whose pool of "tpl" (sized to target) holds
// nothing until partly, then one, and target from ready. Its node reports
// every 100ms, and until staleUntil its report is one from before the
// last take, holding target.
type poolAfter struct {
	partly, ready, staleUntil time.Time
	target                    int
	asked                     atomic.Int32
}

func (p *poolAfter) Nodes(ctx context.Context) ([]client.Node, error) {
	p.asked.Add(1)
	now := time.Now()
	n := 0
	switch {
	case now.After(p.ready):
		n = p.target
	case now.After(p.partly):
		n = 1
	}
	reported := now.Truncate(100 * time.Millisecond)
	if now.Before(p.staleUntil) {
		n, reported = p.target, time.Time{}.Add(time.Hour)
	}
	return []client.Node{{UpdatedAt: reported, Pool: []client.PoolEntry{
		{TemplateID: "tpl", Ready: 5, Target: 5, Prepared: true}, // prepared: not takeable
		{TemplateID: "tpl", Ready: n, Target: p.target},
	}}}, nil
}

// TestAwaitPooled: a c=1 create waits for the pool to hold what it is
// sized to again (not only a sandbox), no longer than it is given, and
// not at all for a pool sized to nothing or an API that cannot list it.
func TestAwaitPooled(t *testing.T) {
	ctx := context.Background()
	refill := &poolAfter{partly: time.Now().Add(100 * time.Millisecond), ready: time.Now().Add(300 * time.Millisecond), target: 2}
	start := time.Now()
	awaitPooled(ctx, refill, "tpl", start, 5*time.Second)
	if d := time.Since(start); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("waited %v for a pool refilled after 300ms", d)
	}

	// A report from before the last create still counts the sandbox it
	// took: not waited on.
	stale := &poolAfter{partly: time.Now().Add(300 * time.Millisecond), ready: time.Now().Add(300 * time.Millisecond), staleUntil: time.Now().Add(200 * time.Millisecond), target: 2}
	start = time.Now()
	awaitPooled(ctx, stale, "tpl", start, 5*time.Second)
	if d := time.Since(start); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("waited %v for a pool refilled after 300ms behind a stale report", d)
	}

	never := &poolAfter{partly: time.Now(), ready: time.Now().Add(time.Hour), target: 2}
	start = time.Now()
	awaitPooled(ctx, never, "tpl", start, 200*time.Millisecond)
	if d := time.Since(start); d < 200*time.Millisecond || d > 2*time.Second {
		t.Errorf("waited %v for a pool that never refills, want the 200ms bound", d)
	}

	unsized := &poolAfter{partly: time.Now().Add(time.Hour), ready: time.Now().Add(time.Hour), target: 0}
	start = time.Now()
	awaitPooled(ctx, unsized, "tpl", start, 5*time.Second)
	if d := time.Since(start); d > time.Second || unsized.asked.Load() != 1 {
		t.Errorf("waited %v (%d listings) for a pool sized to nothing", d, unsized.asked.Load())
	}

	start = time.Now()
	awaitPooled(ctx, nil, "tpl", start, 5*time.Second)
	if d := time.Since(start); d > time.Second {
		t.Errorf("waited %v with no node listing", d)
	}
}

// TestCPUSeriesCountsWorkLeftRunning: the host CPU a sample leaves running
// after it returns (a command's ready-shell refill) is the sample's.
func TestCPUSeriesCountsWorkLeftRunning(t *testing.T) {
	const burn = 200 * time.Millisecond
	var wg sync.WaitGroup
	defer wg.Wait()
	leaveBusy := func(ctx context.Context) (time.Duration, cleanup, error) {
		wg.Go(func() {
			for end := time.Now().Add(burn); time.Now().Before(end); {
			}
		})
		return time.Millisecond, nil, nil
	}
	durs, cpu, err := cpuSeries(context.Background(), newProgress(nil), "busy", 0, 1, burn+300*time.Millisecond, leaveBusy)
	if err != nil {
		t.Fatal(err)
	}
	if len(durs) != 1 {
		t.Fatalf("%d samples, want 1", len(durs))
	}
	// The spin is wall time on one CPU; allow for a host that preempts it.
	if cpu < burn.Seconds()/2 {
		t.Errorf("CPU per sample %.3f s; want at least %.3f s: the work the sample left running was not counted", cpu, burn.Seconds()/2)
	}
}
