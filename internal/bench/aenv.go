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
	// latencies, one sandbox at a time and Concurrency at once.
	CreateSerial, CreateConcurrent []time.Duration
	// Command is the round trip of `true` in a running sandbox.
	Command []time.Duration
	// CPUCount and MemoryMB are the size the server gave the sandboxes, for
	// sizing the bare baseline alike.
	CPUCount, MemoryMB int
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
		size.Do(func() { res.CPUCount, res.MemoryMB = sandboxSize(ctx, opts.API, sb) })
		return d, kill, nil
	}
	if res.CreateSerial, err = series(ctx, p, "create c=1", 1, opts.Iterations, 1, create); err != nil {
		return res, fmt.Errorf("measuring aenv: %w", err)
	}
	label := fmt.Sprintf("create c=%d", opts.Concurrency)
	if res.CreateConcurrent, err = series(ctx, p, label, 0, opts.rounds(), opts.Concurrency, create); err != nil {
		return res, fmt.Errorf("measuring aenv: %w", err)
	}

	if res.Command, err = measureCommand(ctx, p, opts); err != nil {
		return res, fmt.Errorf("measuring aenv: %w", err)
	}
	return res, nil
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

// measureCommand times `true` opts.Iterations times in one sandbox.
func measureCommand(ctx context.Context, p *progress, opts Options) (_ []time.Duration, err error) {
	sb, err := opts.API.Create(ctx, client.CreateOptions{TemplateID: opts.Template, Timeout: sandboxTimeout})
	if err != nil {
		return nil, fmt.Errorf("command: %w", err)
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
	return series(ctx, p, "command", 1, opts.Iterations, 1, run)
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
