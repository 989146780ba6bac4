package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// AenvResults are the samples measured through an aenv server.
type AenvResults struct {
	// CreateSerial and CreateConcurrent are create-to-first-command
	// latencies, one sandbox at a time and Concurrency at once, the latter
	// from a pool that held PoolConcurrent (-1: unknown) when they began:
	// a pool taught a burst of Concurrency within the last minutes (an
	// earlier run of the bench) serves them prestarted, not booted.
	CreateSerial, CreateConcurrent []time.Duration
	PoolConcurrent                 int
	// CreateBackToBack is the same one at a time, each create right after
	// the last one's kill, from a pool that held PoolBackToBack (-1:
	// unknown) when they began.
	CreateBackToBack []time.Duration
	PoolBackToBack   int
	// Command is the round trip of `true` in a running sandbox, back to
	// back; CommandSpaced the same, commandGap after the last one ended.
	Command, CommandSpaced []time.Duration
	// CPUCount and MemoryMB are the size the server gave the sandboxes, for
	// sizing the bare baseline alike.
	CPUCount, MemoryMB int
	// Burst and BurstPooled are create-to-first-command latencies of
	// BurstSize creates at once: the first burst, with the warm pool as
	// it was (PoolBefore sandboxes prestarted), and one after the pool
	// refilled from what the first taught it (PoolTaught prestarted).
	Burst, BurstPooled     []time.Duration
	PoolBefore, PoolTaught int
	// CPUPerCommand is the host CPU-seconds one command of the back to
	// back series cost, the ready shell envd starts after it included (0:
	// not measured).
	CPUPerCommand float64
	// CPUPerCreate is the host CPU-seconds one create of the back to back
	// series cost, its first command and its kill included, and the boot
	// with which the warm pool replaced the sandbox it handed out (waited
	// for after the series): what a pooled create costs the host in the
	// end (0: not measured).
	CPUPerCreate float64
	// CreatesPerSecond is the rate of create, first command and kill that
	// Concurrency clients kept up for SustainFor.
	CreatesPerSecond float64
}

// sandboxTimeout is the lifetime asked for every benchmark sandbox: the
// benchmark kills them itself, and the server reaps any it could not.
const sandboxTimeout = 300

// MeasureAenv measures create-to-first-command (serial and concurrent) and
// the command round trip against opts.API. Every sandbox it creates is killed
// before it returns, also on error.
func MeasureAenv(ctx context.Context, opts Options) (AenvResults, error) {
	opts = opts.withDefaults()
	if opts.API == nil {
		return AenvResults{}, fmt.Errorf("measuring aenv: no API client")
	}
	p := newProgress(opts.Progress)
	var res AenvResults
	var err error

	var size sync.Once
	// poolKey is the template's id, which the nodes list their pools by
	// (opts.Template may be an alias).
	poolKey := opts.Template
	create := func(ctx context.Context) (time.Duration, cleanup, error) {
		start := time.Now()
		sb, err := opts.API.Create(ctx, client.CreateOptions{TemplateID: opts.Template, Timeout: sandboxTimeout})
		if err != nil {
			return 0, nil, err
		}
		kill := func(ctx context.Context) error { return opts.API.Kill(ctx, sb.SandboxID) }
		if err := runTrue(ctx, opts.API, sb); err != nil {
			return 0, kill, err
		}
		d := time.Since(start)
		size.Do(func() {
			res.CPUCount, res.MemoryMB = sandboxSize(ctx, opts.API, sb)
			if sb.TemplateID != "" {
				poolKey = sb.TemplateID
			}
		})
		return d, kill, nil
	}
	// The warm-up create is outside the CPU reading (series runs it
	// first, so the reading starts one create late and is per sample).
	if _, c, err := create(ctx); err != nil || c != nil {
		if err = errors.Join(err, runCleanups(ctx, c)); err != nil {
			return res, fmt.Errorf("measuring aenv: create c=1: warm-up: %w", err)
		}
	}
	// A create at c=1 is what one user sees from a pool that has caught
	// up: each waits (untimed) for the pool to hold what it is sized to
	// again, as it would between one user's creates seconds apart.
	// Without it the series times whichever boot the last create's refill
	// left half done, and swings from a pooled take to a cold boot. The
	// creates of a stream, one right after another, are the back to back
	// series (measureBackToBack).
	nodes, _ := opts.API.(nodeLister)
	var last time.Time
	serial := func(ctx context.Context) (time.Duration, cleanup, error) {
		awaitPooled(ctx, nodes, poolKey, last, pooledWait)
		d, c, err := create(ctx)
		last = time.Now()
		return d, c, err
	}
	if res.CreateSerial, err = series(ctx, p, "create c=1", 0, opts.Iterations, 1, serial); err != nil {
		return res, fmt.Errorf("measuring aenv: %w", err)
	}
	res.PoolConcurrent = pooled(ctx, nodes, poolKey)
	label := fmt.Sprintf("create c=%d", opts.Concurrency)
	if res.CreateConcurrent, err = series(ctx, p, label, 0, opts.rounds(), opts.Concurrency, create); err != nil {
		return res, fmt.Errorf("measuring aenv: %w", err)
	}

	if res.Command, res.CommandSpaced, res.CPUPerCommand, err = measureCommand(ctx, p, opts); err != nil {
		return res, fmt.Errorf("measuring aenv: %w", err)
	}
	if opts.BurstSize > 0 {
		if err := measureBursts(ctx, p, opts, create, &res); err != nil {
			return res, fmt.Errorf("measuring aenv: %w", err)
		}
	}
	if err := measureBackToBack(ctx, p, opts, create, &res); err != nil {
		return res, fmt.Errorf("measuring aenv: %w", err)
	}
	if opts.SustainFor > 0 {
		n, err := sustain(ctx, p, "sustained creates", opts.Concurrency, opts.SustainFor, create)
		if err != nil {
			return res, fmt.Errorf("measuring aenv: %w", err)
		}
		res.CreatesPerSecond = float64(n) / opts.SustainFor.Seconds()
	}
	return res, nil
}

// poolWait bounds the wait for the warm pool to refill between the two
// bursts; a pool that is still short then is reported as it was.
const poolWait = 2 * time.Minute

// pooledWait bounds the wait for the pool to catch up before a c=1
// create: a pool that does not refill in that time (a host out of memory,
// or one growing by several boots into the series' demand) is timed as it
// is.
const pooledWait = 5 * time.Second

// awaitPooled waits, at most within, until the nodes hold as many
// prestarted sandboxes of template as their pools are sized to, by a
// report made after since (a node reports its pool every few seconds: an
// older report may count a sandbox the last create took); it returns at
// once for a pool sized to nothing, or when api cannot say.
func awaitPooled(ctx context.Context, api nodeLister, template string, since time.Time, within time.Duration) {
	watchPool(ctx, api, template, false, within, 50*time.Millisecond, func(ready, target int, at time.Time) bool {
		return target == 0 || (!at.Before(since) && ready >= target)
	})
}

// watchPool reads the nodes' pool of template (its prepared sandboxes
// if prepared) every interval until done says so, the API cannot say
// (ready -1), ctx ends or within has passed, and returns the last count
// of ready sandboxes.
func watchPool(ctx context.Context, api nodeLister, template string, prepared bool, within, every time.Duration, done func(ready, target int, at time.Time) bool) int {
	deadline := time.Now().Add(within)
	for {
		ready, target, at := poolReport(ctx, api, template, prepared)
		if ready < 0 || done(ready, target, at) || time.Now().After(deadline) {
			return ready
		}
		select {
		case <-ctx.Done():
			return ready
		case <-time.After(every):
		}
	}
}

// measureBursts times BurstSize creates at once twice: as the pool stands,
// then once the pool has refilled after what that burst taught it.
func measureBursts(ctx context.Context, p *progress, opts Options, create op, res *AenvResults) error {
	nodes, _ := opts.API.(nodeLister)
	res.PoolBefore = pooled(ctx, nodes, opts.Template)
	label := fmt.Sprintf("burst c=%d", opts.BurstSize)
	var err error
	if res.Burst, err = series(ctx, p, label, 0, 1, opts.BurstSize, create); err != nil {
		return err
	}
	res.PoolTaught = waitPool(ctx, p, nodes, opts.Template, opts.BurstSize)
	res.BurstPooled, err = series(ctx, p, label+", pooled", 0, 1, opts.BurstSize, create)
	return err
}

// measureBackToBack times Iterations creates one at a time, each right
// after the last one's kill, as one client creating sandboxes in a loop
// does: from a pool that has caught up, after the bursts when there are
// any (the pool then holds what they taught it).
func measureBackToBack(ctx context.Context, p *progress, opts Options, create op, res *AenvResults) error {
	nodes, _ := opts.API.(nodeLister)
	res.PoolBackToBack = waitPool(ctx, p, nodes, opts.Template, opts.Iterations)
	cpu := startCPU()
	var err error
	if res.CreateBackToBack, err = series(ctx, p, "create c=1, back to back", 0, opts.Iterations, 1, create); err != nil {
		return err
	}
	// Unlike the c=1 series, whose waits also cover the pool growing into
	// its demand, this one hands out sandboxes of a pool sized already:
	// refilled to what it held, it has booted one for each. (Through an
	// API that cannot list the pool, the refill is not waited for.)
	waitPool(ctx, p, nodes, opts.Template, res.PoolBackToBack)
	res.CPUPerCreate = cpu.per(len(res.CreateBackToBack))
	return nil
}

// nodeLister is an API that can list the nodes and their warm pools.
type nodeLister interface {
	Nodes(ctx context.Context) ([]client.Node, error)
}

// pooled counts the sandboxes of template the nodes hold prestarted (all
// templates' when none is listed under that name, as when it is an
// alias); -1 when the API cannot say.
func pooled(ctx context.Context, api nodeLister, template string) int {
	ready, _, _ := poolReport(ctx, api, template, false)
	return ready
}

// poolReport reads the nodes' pool of template as pooled does, with the
// pool's target size and the time of the oldest node report it read; with
// prepared, the pools of its prepared sandboxes (one per size) instead.
func poolReport(ctx context.Context, api nodeLister, template string, prepared bool) (ready, target int, at time.Time) {
	if api == nil {
		return -1, 0, time.Time{}
	}
	nodes, err := api.Nodes(ctx)
	if err != nil {
		return -1, 0, time.Time{}
	}
	var all, mine, mineTarget, allTarget int
	found := false
	for _, n := range nodes {
		if at.IsZero() || n.UpdatedAt.Before(at) {
			at = n.UpdatedAt
		}
		for _, e := range n.Pool {
			if e.Prepared != prepared {
				continue
			}
			all, allTarget = all+e.Ready, allTarget+e.Target
			if e.SnapshotID == "" && e.TemplateID == template {
				found = true
				mine, mineTarget = mine+e.Ready, mineTarget+e.Target
			}
		}
	}
	if !found {
		return all, allTarget, at
	}
	return mine, mineTarget, at
}

// waitPool waits, at most poolWait, until the pool holds want sandboxes
// of template or as many as it is sized to, and returns what it holds.
func waitPool(ctx context.Context, p *progress, api nodeLister, template string, want int) int {
	return waitPoolUntil(ctx, p, api, template, false, "waiting for the pool", want, func(ready, target int) bool {
		return ready >= want || (target > 0 && ready >= target)
	})
}

// waitPoolUntil waits, at most poolWait and showing label and a count
// towards want, until done says the nodes' pool of template (its prepared
// sandboxes if prepared) is ready, and returns what it holds (-1: the API
// cannot say).
func waitPoolUntil(ctx context.Context, p *progress, api nodeLister, template string, prepared bool, label string, want int, done func(ready, target int) bool) int {
	if api == nil {
		return -1
	}
	p.start(label, want)
	defer p.end()
	return watchPool(ctx, api, template, prepared, poolWait, 500*time.Millisecond, func(ready, target int, _ time.Time) bool {
		p.update(ready)
		return done(ready, target)
	})
}

// sustain runs o in conc loops for d and counts the runs that finished
// inside it; each run's cleanup follows it in its loop (a sustained rate
// pays for teardown too).
func sustain(ctx context.Context, p *progress, label string, conc int, d time.Duration, o op) (int, error) {
	p.start(label, 0)
	defer p.end()
	end := time.Now().Add(d)
	var mu sync.Mutex
	var done int
	var firstErr error
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				_, c, err := o(ctx)
				err = errors.Join(err, runCleanups(ctx, c))
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil && time.Now().Before(end) {
					done++
					p.update(done)
				}
				stop := firstErr != nil
				mu.Unlock()
				if stop {
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return done, fmt.Errorf("%s: %w", label, firstErr)
	}
	return done, ctx.Err()
}

// getter is an API that can describe a sandbox in full.
type getter interface {
	Get(ctx context.Context, id string) (*client.Sandbox, error)
}

// sandboxSize returns sb's CPU count and memory. E2B's create answer does
// not carry them; the full description (if api has it) does.
func sandboxSize(ctx context.Context, api API, sb *client.Sandbox) (cpus, memoryMB int) {
	if sb.CPUCount == 0 {
		if g, ok := api.(getter); ok {
			if full, err := g.Get(ctx, sb.SandboxID); err == nil {
				return full.CPUCount, full.MemoryMB
			}
		}
	}
	return sb.CPUCount, sb.MemoryMB
}

// measureCommand times `true` opts.Iterations times in one sandbox back to
// back, then as many times commandGap apart.
func measureCommand(ctx context.Context, p *progress, opts Options) (b2b, gapped []time.Duration, cpu float64, err error) {
	sb, err := opts.API.Create(ctx, client.CreateOptions{TemplateID: opts.Template, Timeout: sandboxTimeout})
	if err != nil {
		return nil, nil, 0, fmt.Errorf("command: %w", err)
	}
	defer func() {
		if kerr := runCleanups(ctx, func(ctx context.Context) error { return opts.API.Kill(ctx, sb.SandboxID) }); kerr != nil {
			err = errors.Join(err, fmt.Errorf("command: %w", kerr))
		}
	}()
	run := func(ctx context.Context) (time.Duration, cleanup, error) {
		start := time.Now()
		if err := runTrue(ctx, opts.API, sb); err != nil {
			return 0, nil, err
		}
		return time.Since(start), nil, nil
	}
	// The creates before leave the warm pool refilling, whose boots the
	// reading would count.
	awaitQuiet(ctx, opts.Notes, opts.quietWithin, busyCores, "the command series")
	if b2b, cpu, err = cpuSeries(ctx, p, "command", 1, opts.Iterations, commandSettle, run); err != nil {
		return nil, nil, 0, err
	}
	gapped, err = series(ctx, p, "command, spaced", 0, opts.Iterations, 1, spaced(commandGap, run))
	return b2b, gapped, cpu, err
}

// runTrue runs `true` in sb the way the E2B SDKs run a command.
func runTrue(ctx context.Context, api API, sb *client.Sandbox) error {
	code, err := api.Run(ctx, sb.SandboxID, "true", client.RunOptions{AccessToken: sb.EnvdAccessToken})
	if err != nil {
		return err
	}
	if code != 0 {
		return fmt.Errorf("running `true` in %s: %w (%d)", sb.SandboxID, errNonZero, code)
	}
	return nil
}
