package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// BatchAPI is what the batch suite needs of the server.
type BatchAPI interface {
	API
	CreateBatch(ctx context.Context, opts client.CreateOptions, count int, fn func(client.BatchResult)) (int, error)
}

var _ BatchAPI = (*client.Client)(nil)

// BatchResult is the batch suite's figures: the wall time until all of
// Size sandboxes were ready, one batch create against Size single creates
// at once, a sample of each per round.
type BatchResult struct {
	Size              int
	Batch, Parallel   []time.Duration
	BatchP, ParallelP Summary
	// PoolHeld is the fewest prestarted sandboxes the warm pool held
	// before a round's side (-1: the API cannot say).
	PoolHeld int
}

// MeasureBatch times, rounds times, one batch create of size sandboxes
// and size parallel single creates, alternately so that both see the
// same load on the host, each once the warm pool has refilled (waiting
// at most poolWait): what a batch costs from the pool, as RL steps that
// repeat meet it. Every sandbox is killed after its round, untimed.
func MeasureBatch(ctx context.Context, api BatchAPI, template string, size, rounds int, progress io.Writer) (*BatchResult, error) {
	if size < 1 || rounds < 1 {
		return nil, fmt.Errorf("measuring batch creates: size and rounds must be positive (%d, %d)", size, rounds)
	}
	opts := client.CreateOptions{TemplateID: template, Timeout: sandboxTimeout}
	p := newProgress(progress)
	res := &BatchResult{Size: size}
	killAll := func(ids []string) error {
		cleanups := make([]cleanup, len(ids))
		for i, id := range ids {
			cleanups[i] = func(ctx context.Context) error { return api.Kill(ctx, id) }
		}
		return runCleanups(ctx, cleanups...)
	}
	batch := func() (time.Duration, []string, error) {
		var ids []string
		var errs []error
		start := time.Now()
		_, err := api.CreateBatch(ctx, opts, size, func(r client.BatchResult) {
			if r.Err != nil {
				errs = append(errs, fmt.Errorf("sandbox %d: %w", r.Index, r.Err))
				return
			}
			ids = append(ids, r.Sandbox.SandboxID)
		})
		return time.Since(start), ids, errors.Join(append(errs, err)...)
	}
	parallel := func() (time.Duration, []string, error) {
		ids := make([]string, size)
		errs := make([]error, size)
		var wg sync.WaitGroup
		start := time.Now()
		for i := range size {
			wg.Go(func() {
				sb, err := api.Create(ctx, opts)
				if err != nil {
					errs[i] = fmt.Errorf("sandbox %d: %w", i, err)
					return
				}
				ids[i] = sb.SandboxID
			})
		}
		wg.Wait()
		d := time.Since(start)
		var made []string
		for _, id := range ids {
			if id != "" {
				made = append(made, id)
			}
		}
		return d, made, errors.Join(errs...)
	}
	nodes, _ := api.(nodeLister)
	res.PoolHeld = -1
	label := fmt.Sprintf("batch of %d vs %d single creates", size, size)
	defer p.end()
	for r := range rounds {
		for i, side := range []func() (time.Duration, []string, error){batch, parallel} {
			if held := waitPool(ctx, p, nodes, template, size); held >= 0 && (res.PoolHeld < 0 || held < res.PoolHeld) {
				res.PoolHeld = held
			}
			p.start(label, 2*rounds)
			p.update(2*r + i)
			d, ids, err := side()
			if kerr := killAll(ids); err != nil || kerr != nil {
				return nil, fmt.Errorf("measuring batch creates: round %d: %w", r+1, errors.Join(err, kerr))
			}
			if i == 0 {
				res.Batch = append(res.Batch, d)
			} else {
				res.Parallel = append(res.Parallel, d)
			}
			p.update(2*r + i + 1)
		}
	}
	res.BatchP, res.ParallelP = Summarize(res.Batch), Summarize(res.Parallel)
	return res, nil
}

// WriteTable prints the two medians and their ratio.
func (r *BatchResult) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "operation\tp50\tp95\tn\n")
	fmt.Fprintf(tw, "batch create of %d\t%s\t%s\t%d\n", r.Size, FormatDuration(r.BatchP.P50), FormatDuration(r.BatchP.P95), r.BatchP.N)
	fmt.Fprintf(tw, "%d single creates at once\t%s\t%s\t%d\n", r.Size, FormatDuration(r.ParallelP.P50), FormatDuration(r.ParallelP.P95), r.ParallelP.N)
	fmt.Fprintf(tw, "ratio (batch / singles, p50)\t%s\t\t\n", FormatRatio(Ratio(r.BatchP.P50, r.ParallelP.P50)))
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "the warm pool held %d at least before each (-1: unknown)\n", r.PoolHeld)
	return err
}
