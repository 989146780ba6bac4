package bench

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"
)

// bareIdleArgs is the bare idle workload: what DefaultIdleCommand leaves
// running in an aenv sandbox, without envd beside it.
var bareIdleArgs = []string{"/usr/bin/python3", "-c", "import time; time.sleep(10**6)"}

// MeasureBareIdle starts count detached bare containers running a
// sleeping python3, conc at a time, leaves them settle, and reads what
// they cost; all are deleted before it returns.
func MeasureBareIdle(ctx context.Context, opts Options, count, conc int, settle time.Duration) (res BareIdle, err error) {
	opts = opts.withDefaults()
	err = withBareRunner(ctx, opts, "measuring bare idle sandboxes", func(r *bareRunner) error {
		res, err = bareIdle(ctx, r, opts, count, conc, settle)
		return err
	})
	return res, err
}

// bareIdle is MeasureBareIdle with r.
func bareIdle(ctx context.Context, r *bareRunner, opts Options, count, conc int, settle time.Duration) (res BareIdle, err error) {
	window := cpuWindow(settle)
	busyBefore := busyCores(ctx, window)
	before, err := readMeminfo(meminfoPath)
	if err != nil {
		return res, err
	}
	res.Sandboxes, res.Available = count, before["MemAvailable"]
	p := newProgress(opts.Progress)
	p.start("bare idle: starting", count)
	var mu sync.Mutex
	var ids []string
	var errs []error
	runN(ctx, count, conc, func() {
		id, dir, err := r.bundle(bareIdleArgs...)
		if err == nil {
			err = r.runsc(ctx, filepath.Join(dir, "runsc.log"), "run", "--detach", "--bundle="+dir, id)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		ids = append(ids, id)
		p.update(len(ids))
	})
	p.end()
	if err := errors.Join(append(errs, ctx.Err())...); err != nil {
		return res, fmt.Errorf("measuring bare idle sandboxes: %w", err)
	}
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(settle - window):
	}
	res.CPU = max(0, busyCores(ctx, window)-busyBefore) / float64(count)
	after, err := readMeminfo(meminfoPath)
	if err != nil {
		return res, err
	}
	res.AvailableDrop = (before["MemAvailable"] - after["MemAvailable"]) / int64(count)
	usage := make([]int64, 0, len(ids))
	for _, id := range ids {
		// A bare container's cgroup is one level down from the root
		// (writeBareBundle).
		u, err := cgroupMemory(opts.cgroupRoot, "", id)
		if err != nil {
			return res, fmt.Errorf("measuring bare idle sandboxes: %w", err)
		}
		usage = append(usage, u)
	}
	res.Cgroup = medianOf(usage)
	return res, nil
}

// MeasureBareWall times, rounds times, size bare `runsc run /bin/true`
// started at once, until the last has exited: the bare counterpart of a
// batch create.
func MeasureBareWall(ctx context.Context, opts Options, size, rounds int) (_ []time.Duration, err error) {
	opts = opts.withDefaults()
	awaitQuiet(ctx, opts.Notes, opts.quietWithin, busyCores, "the bare runs")
	var out []time.Duration
	err = withBareRunner(ctx, opts, "measuring bare runsc", func(r *bareRunner) error {
		out, err = bareWall(ctx, r, opts, size, rounds)
		return err
	})
	return out, err
}

// bareWall is MeasureBareWall with r.
func bareWall(ctx context.Context, r *bareRunner, opts Options, size, rounds int) ([]time.Duration, error) {
	p := newProgress(opts.Progress)
	wall := func(ctx context.Context) (time.Duration, cleanup, error) {
		start := time.Now()
		samples, err := series(ctx, nil, "", 0, 1, size, r.runTrue)
		if err != nil {
			return 0, nil, err
		}
		if len(samples) != size {
			return 0, nil, fmt.Errorf("%d of %d containers ran", len(samples), size)
		}
		return time.Since(start), nil, nil
	}
	out, err := series(ctx, p, fmt.Sprintf("runsc run, %d at once", size), 0, rounds, 1, wall)
	if err != nil {
		return nil, fmt.Errorf("measuring bare runsc: %w", err)
	}
	return out, nil
}
