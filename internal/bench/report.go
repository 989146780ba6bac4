package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Report pairs each aenv measurement with its bare runsc baseline.
type Report struct {
	CPUs        int    `json:"cpus"`
	Iterations  int    `json:"iterations"`
	Concurrency int    `json:"concurrency"`
	Template    string `json:"template"`
	Runsc       string `json:"runsc"`
	RootFS      string `json:"rootfs"`
	Rows        []Row  `json:"rows"`
}

// Row is one operation measured both ways.
type Row struct {
	// Operation is what aenv did; Baseline what bare runsc did instead.
	Operation string  `json:"operation"`
	Baseline  string  `json:"baseline"`
	Aenv      Summary `json:"aenv"`
	Bare      Summary `json:"bare"`
	// RatioP50 is Aenv.P50 / Bare.P50, 0 when either is missing.
	RatioP50 float64 `json:"ratio_p50,omitempty"`
}

// NewReport summarises both halves' samples. opts must be the options the
// measurements ran with (their defaults applied here too).
func NewReport(opts Options, cpus int, a AenvResults, b BareResults) Report {
	opts = opts.withDefaults()
	row := func(op, base string, aenv, bare []time.Duration) Row {
		r := Row{Operation: op, Baseline: base, Aenv: Summarize(aenv), Bare: Summarize(bare)}
		r.RatioP50 = Ratio(r.Aenv.P50, r.Bare.P50)
		return r
	}
	c := opts.Concurrency
	return Report{
		CPUs:        cpus,
		Iterations:  opts.Iterations,
		Concurrency: c,
		Template:    opts.Template,
		Runsc:       opts.RunscPath,
		RootFS:      opts.RootFS,
		Rows: []Row{
			row("create to first command, c=1", "runsc run /bin/true", a.CreateSerial, b.RunSerial),
			row(fmt.Sprintf("create to first command, c=%d", c), fmt.Sprintf("runsc run /bin/true, %d at once", c), a.CreateConcurrent, b.RunConcurrent),
			row("command round trip", "runsc exec /bin/true", a.Command, b.Exec),
			row("command round trip", "runsc exec /bin/bash -l -c true", a.Command, b.ExecShell),
		},
	}
}

// WriteJSON writes r as indented JSON, durations in milliseconds.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r for a terminal.
func (r Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "aenv bench: %d CPUs, %d iterations, concurrency %d, template %s\n",
		r.CPUs, r.Iterations, r.Concurrency, r.Template)
	fmt.Fprintf(w, "bare baseline: %s on %s\n\n", r.Runsc, r.RootFS)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tN\tAENV P50\tAENV P95\tBARE P50\tBARE P95\tAENV/BARE P50\tBARE RUNSC DID")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\n", row.Operation, row.Aenv.N, row.Bare.N,
			FormatDuration(row.Aenv.P50), FormatDuration(row.Aenv.P95),
			FormatDuration(row.Bare.P50), FormatDuration(row.Bare.P95),
			FormatRatio(row.RatioP50), row.Baseline)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\naenv runs a command as the E2B SDKs do: /bin/bash -l -c CMD through envd.\n"+
		"N is aenv/bare samples; percentiles are nearest-rank.")
	return err
}

// FormatDuration renders d in milliseconds with precision that suits its
// size, or seconds from 10 s; "-" for a missing (zero) value.
func FormatDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", millis(d))
	case d < 10*time.Second:
		return fmt.Sprintf("%.1fms", millis(d))
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

// FormatRatio renders a ratio as "1.25x", or "-" when it is missing (0).
func FormatRatio(f float64) string {
	if f <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", f)
}
