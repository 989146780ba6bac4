package bench

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// SoakAPI is what the soak suite needs of the server.
type SoakAPI interface {
	API
	Metrics(ctx context.Context) (map[string]float64, error)
}

var _ SoakAPI = (*client.Client)(nil)

// soakSeries are the server's own figures a leak shows in.
var soakSeries = []struct{ series, what string }{
	{"process_resident_memory_bytes", "resident memory (bytes)"},
	{"go_memstats_heap_inuse_bytes", "Go heap in use (bytes)"},
	{"go_goroutines", "goroutines"},
	{"process_open_fds", "open file descriptors"},
}

// SoakResult is what a soak run saw.
type SoakResult struct {
	Cycles, Failed int
	Took           time.Duration
	// Start and End are the server's figures before and after, by series.
	Start, End map[string]float64
}

// Soak runs cycles create/exec/kill cycles, concurrency at a time, and
// reads the server's figures before and after (after a pause for the
// server to settle), so that a leak per sandbox shows as growth.
func Soak(ctx context.Context, api SoakAPI, template string, cycles, concurrency int, progress io.Writer) (*SoakResult, error) {
	settle := func() (map[string]float64, error) {
		time.Sleep(2 * time.Second)
		return api.Metrics(ctx)
	}
	start, err := settle()
	if err != nil {
		return nil, err
	}
	res := &SoakResult{Cycles: cycles, Start: start}
	var failed, done atomic.Int64
	work := make(chan struct{})
	var wg sync.WaitGroup
	began := time.Now()
	for range max(concurrency, 1) {
		wg.Go(func() {
			for range work {
				if err := soakCycle(ctx, api, template); err != nil {
					failed.Add(1)
				}
				if n := done.Add(1); progress != nil && n%50 == 0 {
					fmt.Fprintf(progress, "\rsoak: %d/%d cycles", n, cycles)
				}
			}
		})
	}
	for range cycles {
		select {
		case work <- struct{}{}:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	if progress != nil {
		fmt.Fprintln(progress)
	}
	res.Took, res.Failed = time.Since(began), int(failed.Load())
	if res.End, err = settle(); err != nil {
		return nil, err
	}
	return res, ctx.Err()
}

func soakCycle(ctx context.Context, api SoakAPI, template string) error {
	sb, err := api.Create(ctx, client.CreateOptions{TemplateID: template, Timeout: 120})
	if err != nil {
		return err
	}
	code, err := api.Run(ctx, sb.SandboxID, "true", client.RunOptions{AccessToken: sb.EnvdAccessToken})
	if kerr := api.Kill(ctx, sb.SandboxID); err == nil {
		err = kerr
	}
	if err == nil && code != 0 {
		err = fmt.Errorf("true exited %d", code)
	}
	return err
}

// WriteTable prints the figures side by side with their change; growth
// of more than 10% is marked.
func (r *SoakResult) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "soak: %d create/exec/kill cycles in %s (%.1f/s), %d failed\n\n",
		r.Cycles, r.Took.Round(time.Second), float64(r.Cycles)/r.Took.Seconds(), r.Failed)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVER\tSTART\tEND\tCHANGE\t")
	for _, s := range soakSeries {
		a, b := r.Start[s.series], r.End[s.series]
		change, mark := "-", ""
		if a > 0 {
			pct := 100 * (b - a) / a
			change = fmt.Sprintf("%+.1f%%", pct)
			if pct > 10 {
				mark = "grew"
			}
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%s\t%s\n", s.what, a, b, change, mark)
	}
	return tw.Flush()
}
