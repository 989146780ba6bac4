package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// DefaultInterpreterTemplate is the template the runCode measurement
// creates its sandboxes from: the code-interpreter SDK's default.
const DefaultInterpreterTemplate = "code-interpreter"

// InterpreterAPI is what the runCode measurement needs of the server.
type InterpreterAPI interface {
	API
	RunCode(ctx context.Context, id, code, accessToken string) (*client.Execution, error)
}

var _ InterpreterAPI = (*client.Client)(nil)

// RunCodeResults are the code interpreter's latencies.
type RunCodeResults struct {
	// RunCode is the round trip of runCode('1+1') in a running sandbox.
	RunCode []time.Duration
	// FirstResult is create to the first runCode result, each create once
	// the warm pool has refilled.
	FirstResult []time.Duration
}

// firstResultSettle is the pause before each create-to-first-result
// sample when the server cannot list its pools: a pooled sandbox is taken
// by each, and its replacement's boot would otherwise be what the next
// one measures. A server that can is asked instead (awaitPooled, at most
// firstResultWait: a code interpreter's restore is slower than a boot).
const (
	firstResultSettle = 3 * time.Second
	firstResultWait   = 10 * time.Second
)

// MeasureRunCode times runCode('1+1') iterations times in one sandbox of
// template (after warm-ups), then create to first result, firsts times.
// Every sandbox it creates is killed before it returns. A server without
// the template answers the first create with 404, which is returned
// wrapped.
func MeasureRunCode(ctx context.Context, api InterpreterAPI, template string, iterations, firsts int, progress io.Writer) (res RunCodeResults, err error) {
	p := newProgress(progress)
	runCode := func(ctx context.Context, sb *client.Sandbox) error {
		ex, err := api.RunCode(ctx, sb.SandboxID, "1+1", sb.EnvdAccessToken)
		if err != nil {
			return err
		}
		if ex.Text != "2" || ex.ErrorName != "" {
			return fmt.Errorf("runCode('1+1') in %s gave %q (error %s %s), not 2", sb.SandboxID, ex.Text, ex.ErrorName, ex.ErrorValue)
		}
		return nil
	}
	create := func(ctx context.Context) (*client.Sandbox, cleanup, error) {
		sb, err := api.Create(ctx, client.CreateOptions{TemplateID: template, Timeout: sandboxTimeout})
		if err != nil {
			return nil, nil, fmt.Errorf("runCode: creating from %s: %w", template, err)
		}
		return sb, func(ctx context.Context) error { return api.Kill(ctx, sb.SandboxID) }, nil
	}
	sb, kill, err := create(ctx)
	if err != nil {
		return res, err
	}
	defer func() {
		if kerr := runCleanups(ctx, kill); kerr != nil {
			err = errors.Join(err, fmt.Errorf("runCode: %w", kerr))
		}
	}()
	nodes, _ := api.(nodeLister)
	poolKey := cmp.Or(sb.TemplateID, template) // what the pools are listed by
	// The pool's replacement for the sandbox just taken restores while
	// nothing else runs; the round trips are timed after it.
	awaitPooled(ctx, nodes, poolKey, time.Now(), firstResultWait)
	round := func(ctx context.Context) (time.Duration, cleanup, error) {
		start := time.Now()
		err := runCode(ctx, sb)
		return time.Since(start), nil, err
	}
	if res.RunCode, err = series(ctx, p, "runCode", 3, iterations, 1, round); err != nil {
		return res, fmt.Errorf("runCode: %w", err)
	}
	last := time.Now()
	first := func(ctx context.Context) (time.Duration, cleanup, error) {
		if nodes != nil {
			awaitPooled(ctx, nodes, poolKey, last, firstResultWait)
		} else {
			select {
			case <-ctx.Done():
				return 0, nil, ctx.Err()
			case <-time.After(firstResultSettle):
			}
		}
		start := time.Now()
		sb, kill, err := create(ctx)
		last = time.Now()
		if err != nil {
			return 0, nil, err
		}
		err = runCode(ctx, sb)
		return time.Since(start), kill, err
	}
	if res.FirstResult, err = series(ctx, p, "create to first runCode result", 0, firsts, 1, first); err != nil {
		return res, fmt.Errorf("runCode: %w", err)
	}
	return res, nil
}
