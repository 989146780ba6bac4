package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

// outputFlag adds --output/-o (table or json) to a command that lists.
func outputFlag(cmd *cobra.Command, output *string) {
	cmd.Flags().StringVarP(output, "output", "o", "table", "output format: table or json")
}

// checkOutput validates --output before anything is asked of the server.
func checkOutput(cmd *cobra.Command, output string) error {
	if output != "table" && output != "json" {
		return &usageError{cmd: cmd, err: fmt.Errorf("unknown --output %q: want table or json", output)}
	}
	return nil
}

// writeJSON prints v indented, for people and for jq.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parsePairs parses repeated KEY=VALUE flags; flag names the flag for
// the error message.
func parsePairs(cmd *cobra.Command, flag string, vals []string) (map[string]string, error) {
	if len(vals) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(vals))
	for _, kv := range vals {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, &usageError{cmd: cmd, err: fmt.Errorf("--%s %q: want KEY=VALUE", flag, kv)}
		}
		out[k] = v
	}
	return out, nil
}

// progress reports the bytes a transfer has moved on a terminal line,
// rewritten a few times a second.
type progress struct {
	w     io.Writer
	label string
	total int64 // -1: unknown
	start time.Time

	mu   sync.Mutex
	done int64

	stop chan struct{}
	wg   sync.WaitGroup
}

// progressThreshold: transfers smaller than this finish before a
// progress line would be worth reading.
const progressThreshold = 1 << 20

// startProgress starts reporting to w; nil w reports nothing.
func startProgress(w io.Writer, label string, total int64) *progress {
	p := &progress{w: w, label: label, total: total, start: time.Now(), stop: make(chan struct{})}
	if w == nil {
		return p
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.print(false)
			}
		}
	}()
	return p
}

func (p *progress) add(n int) {
	p.mu.Lock()
	p.done += int64(n)
	p.mu.Unlock()
}

func (p *progress) print(final bool) {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	el := time.Since(p.start).Seconds()
	rate := ""
	if el > 0 {
		rate = humanBytes(int64(float64(done)/el)) + "/s"
	}
	line := fmt.Sprintf("%s %s", p.label, humanBytes(done))
	if p.total >= 0 {
		pct := 100
		if p.total > 0 {
			pct = int(done * 100 / p.total)
		}
		line = fmt.Sprintf("%s %s / %s %3d%%", p.label, humanBytes(done), humanBytes(p.total), pct)
	}
	end := ""
	if final {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r\x1b[K%s  %s%s", line, rate, end)
}

// finish stops reporting; ok prints the final figures on their line.
func (p *progress) finish(ok bool) {
	if p.w == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	if ok {
		p.print(true)
	} else {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
}

// progressReader counts what is read through it.
type progressReader struct {
	r io.Reader
	p *progress
}

func (r *progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.add(n)
	return n, err
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// listCmd makes cmd list what fetch (a client method, such as
// (*client.Client).Nodes) returns: a table (header, then a row per item,
// cells tab-separated) or, with -o json, JSON.
func listCmd[T any](g *globals, cmd *cobra.Command, fetch func(*client.Client, context.Context) ([]T, error),
	header string, row func(T) string) *cobra.Command {
	var output string
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := checkOutput(cmd, output); err != nil {
			return err
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		items, err := fetch(c, cmd.Context())
		if err != nil {
			return err
		}
		if output == "json" {
			return writeJSON(cmd.OutOrStdout(), items)
		}
		tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, header)
		for _, it := range items {
			fmt.Fprintln(tw, row(it))
		}
		return tw.Flush()
	}
	outputFlag(cmd, &output)
	return cmd
}
