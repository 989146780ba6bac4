package bench

import (
	"context"
	"fmt"
	"io"
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

// soakSeries are the server's own figures a leak shows in, with the
// column each has in the table.
var soakSeries = []struct{ series, column string }{
	{"go_gc_heap_live_bytes", "LIVE HEAP"},
	{"go_memstats_heap_inuse_bytes", "HEAP IN USE"},
	{"process_resident_memory_bytes", "RSS"},
	{"go_goroutines", "GOROUTINES"},
	{"process_open_fds", "FDS"},
}

// SoakRound is one round of a soak run and the server's figures after it.
type SoakRound struct {
	Cycles, Failed int
	Took           time.Duration
	// End is the server's figures after the round, by series.
	End map[string]float64
}

// SoakResult is what a soak run saw.
type SoakResult struct {
	// Cycles is the cycles of each round.
	Cycles int
	// Start is the server's figures before the first round, by series.
	Start  map[string]float64
	Rounds []SoakRound
}

// SoakOptions say how long a soak runs.
type SoakOptions struct {
	// Cycles are the create/exec/kill cycles of each round, Concurrency
	// of them at a time.
	Cycles, Rounds, Concurrency int
	// Settle is how long the server is left alone before its figures are
	// read, for the kills' last clean-up (0: 2 s).
	Settle time.Duration
}

// Soak runs opts.Rounds rounds of create/exec/kill cycles and reads the server's figures before the first round and after
// each (after a pause for the server to settle). A leak per sandbox shows
// as growth that goes on round after round; the first round may grow
// while caches and pools fill.
func Soak(ctx context.Context, api SoakAPI, template string, opts SoakOptions, progress io.Writer) (*SoakResult, error) {
	cycles, rounds := opts.Cycles, max(opts.Rounds, 1)
	if opts.Settle == 0 {
		opts.Settle = 2 * time.Second
	}
	settle := func() (map[string]float64, error) {
		select {
		case <-time.After(opts.Settle):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return api.Metrics(ctx)
	}
	start, err := settle()
	if err != nil {
		return nil, err
	}
	res := &SoakResult{Cycles: cycles, Start: start}
	for r := range rounds {
		round := soakRound(ctx, api, template, cycles, opts.Concurrency, func(n int) {
			if progress != nil && n%50 == 0 {
				fmt.Fprintf(progress, "\rsoak: round %d/%d, %d/%d cycles", r+1, rounds, n, cycles)
			}
		})
		if round.End, err = settle(); err != nil {
			return res, err
		}
		res.Rounds = append(res.Rounds, round)
	}
	if progress != nil {
		fmt.Fprintln(progress)
	}
	return res, ctx.Err()
}

// soakRound runs cycles cycles, concurrency at a time.
func soakRound(ctx context.Context, api SoakAPI, template string, cycles, concurrency int, done func(int)) SoakRound {
	var failed, n atomic.Int64
	began := time.Now()
	runN(ctx, cycles, concurrency, func() {
		if err := soakCycle(ctx, api, template); err != nil {
			failed.Add(1)
		}
		done(int(n.Add(1)))
	})
	return SoakRound{Cycles: cycles, Failed: int(failed.Load()), Took: time.Since(began)}
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

// WriteTable prints the server's figures before the first round and after
// each, one row a round, memory in MiB, with the change of the live heap
// from the round before; a round whose live heap grew by more than
// 2 MiB (the bound per thousand cycles a server flat under churn keeps) is
// marked.
func (r *SoakResult) WriteTable(w io.Writer) error {
	cycles, failed := 0, 0
	var took time.Duration
	for _, rd := range r.Rounds {
		cycles, failed, took = cycles+rd.Cycles, failed+rd.Failed, took+rd.Took
	}
	rate := 0.0
	if took > 0 {
		rate = float64(cycles) / took.Seconds()
	}
	fmt.Fprintf(w, "soak: %d rounds of %d create/exec/kill cycles in %s (%.1f/s), %d failed\n\n",
		len(r.Rounds), r.Cycles, took.Round(time.Second), rate, failed)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "ROUND\tCYCLES\tFAILED\tTOOK\t")
	for _, s := range soakSeries {
		fmt.Fprintf(tw, "%s\t", s.column)
	}
	fmt.Fprint(tw, "LIVE HEAP CHANGE\t\t\n")
	row := func(name string, rd *SoakRound, figs, prev map[string]float64) {
		if rd == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t", name)
		} else {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t", name, rd.Cycles, rd.Failed, rd.Took.Round(100*time.Millisecond))
		}
		for _, s := range soakSeries {
			v, ok := figs[s.series]
			switch {
			case !ok:
				fmt.Fprint(tw, "-\t")
			case s.column == "GOROUTINES" || s.column == "FDS":
				fmt.Fprintf(tw, "%.0f\t", v)
			default:
				fmt.Fprintf(tw, "%.1f MiB\t", v/(1<<20))
			}
		}
		change, mark := "-", ""
		if a, ok := prev[soakSeries[0].series]; ok && rd != nil {
			d := figs[soakSeries[0].series] - a
			change = fmt.Sprintf("%+.1f MiB", d/(1<<20))
			if perK := d / float64(max(rd.Cycles, 1)) * 1000; perK > 2<<20 {
				mark = "grew"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t\n", change, mark)
	}
	row("start", nil, r.Start, nil)
	prev := r.Start
	for i := range r.Rounds {
		row(fmt.Sprint(i+1), &r.Rounds[i], r.Rounds[i].End, prev)
		prev = r.Rounds[i].End
	}
	return tw.Flush()
}
