package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"text/tabwriter"
	"time"
)

// Report pairs each aenv measurement with its bare runsc baseline.
type Report struct {
	CPUs int `json:"cpus"`
	// Iterations and Concurrency are the create suite's (0 when it did not
	// run); SnapshotIterations the snapshot suite's.
	Iterations         int    `json:"iterations,omitempty"`
	Concurrency        int    `json:"concurrency,omitempty"`
	SnapshotIterations int    `json:"snapshot_iterations,omitempty"`
	Template           string `json:"template"`
	Runsc              string `json:"runsc"`
	RootFS             string `json:"rootfs"`
	Rows               []Row  `json:"rows"`
	// Sizes describe the sandboxes of the snapshot suite.
	Sizes []SizeInfo `json:"sizes,omitempty"`
	// Targets are the goals the measurements are checked against.
	Targets []Target `json:"targets,omitempty"`
	// Memory is what pausing sandboxes freed; nil if not measured.
	Memory *MemoryReport `json:"memory,omitempty"`
	// Figures are measurements other than latencies (CPU, rates), each
	// beside its bare counterpart.
	Figures []Figure `json:"figures,omitempty"`
	// Notes say what the run left out and why.
	Notes []string `json:"notes,omitempty"`
}

// Figure is one quantity measured both ways.
type Figure struct {
	Name     string  `json:"name"`
	Unit     string  `json:"unit"`
	Baseline string  `json:"baseline"`
	Aenv     float64 `json:"aenv"`
	Bare     float64 `json:"bare"`
	// Ratio is Aenv / Bare, 0 when either is missing.
	Ratio float64 `json:"ratio,omitempty"`
}

func newFigure(name, unit, base string, aenv, bare float64) Figure {
	f := Figure{Name: name, Unit: unit, Baseline: base, Aenv: aenv, Bare: bare}
	if aenv > 0 && bare > 0 {
		f.Ratio = aenv / bare
	}
	return f
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

// SizeInfo is how big a snapshot-suite sandbox was, both ways.
type SizeInfo struct {
	Name string `json:"name"`
	// MemoryMiB is the running sandbox's memory cgroup usage, ImageMiB
	// the size of a saved image of it.
	AenvMemoryMiB float64 `json:"aenv_memory_mib"`
	BareMemoryMiB float64 `json:"bare_memory_mib"`
	AenvImageMiB  float64 `json:"aenv_image_mib"`
	BareImageMiB  float64 `json:"bare_image_mib"`
}

// Target is one goal and whether the measurements met it.
type Target struct {
	Name  string `json:"name"`
	Value string `json:"value"`
	Met   bool   `json:"met"`
}

// MemoryReport is MemoryResults in MiB.
type MemoryReport struct {
	Sandboxes int `json:"sandboxes"`
	// Running, Paused and Resumed are the readings at each stage.
	Running MemoryStage `json:"running"`
	Paused  MemoryStage `json:"paused"`
	Resumed MemoryStage `json:"resumed"`
	// FreedPerSandboxMiB is the host memory (MemAvailable) pausing freed,
	// per sandbox; CgroupPerSandboxMiB a running sandbox's cgroup usage.
	FreedPerSandboxMiB  float64  `json:"freed_per_sandbox_mib"`
	CgroupPerSandboxMiB float64  `json:"cgroup_per_sandbox_mib"`
	Pause               Summary  `json:"pause"`
	Resume              Summary  `json:"resume"`
	LeftProcesses       []string `json:"left_processes,omitempty"`
}

// MemoryStage is one MemorySample in MiB.
type MemoryStage struct {
	AvailableMiB float64 `json:"available_mib"`
	ShmemMiB     float64 `json:"shmem_mib"`
	CgroupMiB    float64 `json:"cgroup_mib"`
	Cgroups      int     `json:"cgroups"`
}

// ResumeTarget is how much slower than a bare `runsc restore` aenv's
// resume may be at the median.
const ResumeTarget = 1.2

// NewReport starts a report of measurements made with opts (their
// defaults applied here too); Add* fill it.
func NewReport(opts Options, cpus int) Report {
	opts = opts.withDefaults()
	return Report{
		CPUs:     cpus,
		Template: opts.Template,
		Runsc:    opts.RunscPath,
		RootFS:   opts.RootFS,
		Rows:     []Row{},
	}
}

func newRow(op, base string, aenv, bare []time.Duration) Row {
	r := Row{Operation: op, Baseline: base, Aenv: Summarize(aenv), Bare: Summarize(bare)}
	r.RatioP50 = Ratio(r.Aenv.P50, r.Bare.P50)
	return r
}

// AddCreate adds the create suite's rows; opts are the options it ran
// with.
func (r *Report) AddCreate(opts Options, a AenvResults, b BareResults) {
	opts = opts.withDefaults()
	c := opts.Concurrency
	r.Iterations, r.Concurrency = opts.Iterations, c
	r.Rows = append(r.Rows, newRow("create to first command, c=1", "runsc run /bin/true", a.CreateSerial, b.RunSerial))
	if len(a.CreateBackToBack) > 0 {
		r.Rows = append(r.Rows, newRow("create to first command, c=1, back to back, "+poolLabel(a.PoolBackToBack), "runsc run /bin/true", a.CreateBackToBack, b.RunSerial))
	}
	r.Rows = append(r.Rows,
		newRow(fmt.Sprintf("create to first command, c=%d, %s", c, poolLabel(a.PoolConcurrent)), fmt.Sprintf("runsc run /bin/true, %d at once", c), a.CreateConcurrent, b.RunConcurrent),
		newRow("command round trip", "runsc exec /bin/true", a.Command, b.Exec),
		newRow("command round trip", "runsc exec /bin/bash -l -c true", a.Command, b.ExecShell),
	)
	if len(a.CommandSpaced) > 0 {
		gap := fmt.Sprintf("%d ms", commandGap.Milliseconds())
		r.Rows = append(r.Rows, newRow("command round trip, "+gap+" apart", "runsc exec /bin/true, "+gap+" apart", a.CommandSpaced, b.ExecSpaced))
	}
	if len(a.Burst) > 0 {
		n := len(a.Burst)
		base := fmt.Sprintf("runsc run /bin/true, %d at once", n)
		empty := newRow(fmt.Sprintf("create to first command, c=%d, %s", n, poolLabel(a.PoolBefore)), base, a.Burst, b.Burst)
		pooled := newRow(fmt.Sprintf("create to first command, c=%d, pool refilled, %s", n, poolLabel(a.PoolTaught)), base, a.BurstPooled, b.Burst)
		r.Rows = append(r.Rows, empty, pooled)
		r.Targets = append(r.Targets,
			Target{Name: fmt.Sprintf("%d creates at once after a burst taught the pool: p50 <= 300ms, p99 <= 1s", n),
				Value: fmt.Sprintf("p50 %s, p99 %s", FormatDuration(pooled.Aenv.P50), FormatDuration(pooled.Aenv.P99)),
				Met:   pooled.Aenv.N > 0 && pooled.Aenv.P50 <= 300*time.Millisecond && pooled.Aenv.P99 <= time.Second},
			Target{Name: fmt.Sprintf("%d creates at once, first burst: p50 <= 0.8x bare", n),
				Value: FormatRatio(empty.RatioP50), Met: empty.RatioP50 > 0 && empty.RatioP50 <= 0.8})
	}
	serial := Summarize(a.CreateSerial)
	cmd := Summarize(a.Command)
	cmdRatio := Ratio(cmd.P50, Summarize(b.Exec).P50)
	r.Targets = append(r.Targets,
		Target{Name: "create to first command, c=1, the pool caught up between creates: p50 <= 25ms", Value: FormatDuration(serial.P50),
			Met: serial.N > 0 && serial.P50 <= 25*time.Millisecond},
		Target{Name: "command round trip: p50 <= 15ms or <= 1.2x bare runsc exec",
			Value: fmt.Sprintf("%s, %s", FormatDuration(cmd.P50), FormatRatio(cmdRatio)),
			Met:   cmd.N > 0 && (cmd.P50 <= 15*time.Millisecond || (cmdRatio > 0 && cmdRatio <= 1.2))})
	if a.CPUPerCreate > 0 || b.CPUPerRun > 0 {
		r.Figures = append(r.Figures, newFigure("host CPU per create, c=1 back to back (its command, its kill and the pool's refill)", "CPU-ms",
			"runsc run /bin/true (delete included)", a.CPUPerCreate*1000, b.CPUPerRun*1000))
	}
	if a.CPUPerCommand > 0 || b.CPUPerExecShell > 0 {
		r.Figures = append(r.Figures, newFigure("host CPU per command, back to back (the ready shell started after it included)", "CPU-ms",
			"runsc exec /bin/bash -l -c true", a.CPUPerCommand*1000, b.CPUPerExecShell*1000))
	}
	if a.CreatesPerSecond > 0 || b.RunsPerSecond > 0 {
		r.Figures = append(r.Figures, newFigure(fmt.Sprintf("sustained creates/s, %d clients (create, command, kill)", c), "/s",
			fmt.Sprintf("runsc run /bin/true and delete, %d at a time", c), a.CreatesPerSecond, b.RunsPerSecond))
	}
}

// preparedLabel says how many prepared sandboxes the pool held.
func preparedLabel(n int) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}

// poolLabel says what the warm pool held before a burst.
func poolLabel(n int) string {
	if n < 0 {
		return "pool unknown"
	}
	return fmt.Sprintf("pool held %d", n)
}

// AddSnapshot adds the snapshot suite's rows, sizes, targets and memory;
// the halves' sizes are paired by name.
func (r *Report) AddSnapshot(opts Options, res SnapshotResults) {
	opts = opts.withDefaults()
	r.SnapshotIterations = opts.SnapshotIterations
	bare := map[string]SnapshotSamples{}
	for _, s := range res.Bare {
		bare[s.Size.Name] = s.Samples
	}
	for _, as := range res.Aenv {
		name := as.Size.Name
		x, y := as.Samples, bare[name]
		r.Rows = append(r.Rows,
			newRow("snapshot (leave running), "+name, "runsc checkpoint --leave-running", x.Snapshot, y.Snapshot),
			newRow("pause, "+name, "runsc checkpoint + runsc delete", x.Pause, y.Pause),
			newRow("resume, "+name, "runsc restore --detach", x.Resume, y.Resume),
			newRow("resume, "+name+", beside a prepared restore", "runsc create ahead (untimed), then runsc restore into it", x.Resume, y.ResumePrepared),
			newRow("resume + first command, "+name, "runsc restore + runsc exec /bin/true", x.ResumeCommand, y.ResumeCommand),
			newRow("create from snapshot to first command, "+name, "runsc restore (new container) + exec", x.FromSnapshot, y.FromSnapshot),
		)
		for _, n := range slices.Sorted(maps.Keys(x.Fork)) {
			base := fmt.Sprintf("runsc checkpoint --leave-running + %d restore", n)
			if n > 1 {
				base += fmt.Sprintf("s, %d at a time", forkParallelism(n))
			}
			r.Rows = append(r.Rows, newRow(fmt.Sprintf("fork %d, %s: wall", n, name), base, x.Fork[n], y.Fork[n]))
			if taught := x.ForkTaught[n]; len(taught) > 0 {
				r.Rows = append(r.Rows, newRow(fmt.Sprintf("fork %d, %s, pool taught (%s prepared): wall", n, name, preparedLabel(x.TaughtPrepared)), base, taught, y.Fork[n]))
			}
			if n > 1 {
				r.Rows = append(r.Rows, newRow(fmt.Sprintf("fork %d, %s: per child", n, name), "the same, per restore",
					perChild(x.Fork[n], n), perChild(y.Fork[n], n)))
			}
		}
		if len(x.PauseCPU)+len(y.PauseCPU) > 0 {
			r.Figures = append(r.Figures,
				newFigure("host CPU per pause, "+name+" (p50)", "CPU-ms", "runsc checkpoint + runsc delete",
					medianOf(x.PauseCPU)*1000, medianOf(y.PauseCPU)*1000),
				newFigure("host CPU per resume, "+name+" (p50)", "CPU-ms", "runsc restore --detach",
					medianOf(x.ResumeCPU)*1000, medianOf(y.ResumeCPU)*1000))
		}
		r.Sizes = append(r.Sizes, SizeInfo{
			Name:          name,
			AenvMemoryMiB: mib(x.MemoryBytes), BareMemoryMiB: mib(y.MemoryBytes),
			AenvImageMiB: mib(x.ImageBytes), BareImageMiB: mib(y.ImageBytes),
		})
		ratio := Ratio(Summarize(x.Resume).P50, Summarize(y.Resume).P50)
		r.Targets = append(r.Targets, Target{
			Name:  fmt.Sprintf("resume p50 within %.1fx of bare restore, %s", ResumeTarget, name),
			Value: FormatRatio(ratio),
			Met:   ratio > 0 && ratio <= ResumeTarget,
		})
	}
	if m := res.Memory; m != nil {
		r.Memory = &MemoryReport{
			Sandboxes:           m.Sandboxes,
			Running:             stage(m.Running),
			Paused:              stage(m.Paused),
			Resumed:             stage(m.Resumed),
			FreedPerSandboxMiB:  mib(m.FreedPerSandbox()),
			CgroupPerSandboxMiB: mib(m.CgroupPerSandbox()),
			Pause:               Summarize(m.Pause),
			Resume:              Summarize(m.Resume),
			LeftProcesses:       m.LeftProcesses,
		}
		r.Targets = append(r.Targets, Target{
			Name:  "paused sandboxes keep no cgroup and no process",
			Value: fmt.Sprintf("%d cgroups, %d processes", m.Paused.Cgroups, len(m.LeftProcesses)),
			Met:   m.Paused.Cgroups == 0 && len(m.LeftProcesses) == 0,
		})
	}
}

// perChild divides each fork's wall time by its number of children.
func perChild(samples []time.Duration, children int) []time.Duration {
	out := make([]time.Duration, len(samples))
	for i, d := range samples {
		out[i] = d / time.Duration(children)
	}
	return out
}

func stage(s MemorySample) MemoryStage {
	return MemoryStage{AvailableMiB: mib(s.AvailableBytes), ShmemMiB: mib(s.ShmemBytes), CgroupMiB: mib(s.CgroupBytes), Cgroups: s.Cgroups}
}

// mib converts bytes to MiB rounded to a tenth.
func mib(b int64) float64 {
	return math.Round(float64(b)/(1<<20)*10) / 10
}

// WriteJSON writes r as indented JSON, durations in milliseconds.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes r for a terminal.
func (r Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "aenv bench: %d CPUs, template %s", r.CPUs, r.Template)
	if r.Iterations > 0 {
		fmt.Fprintf(w, ", %d iterations, concurrency %d", r.Iterations, r.Concurrency)
	}
	if r.SnapshotIterations > 0 {
		fmt.Fprintf(w, ", %d snapshot iterations", r.SnapshotIterations)
	}
	fmt.Fprintf(w, "\nbare baseline: %s on %s\n\n", r.Runsc, r.RootFS)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "OPERATION\tN\tAENV P50\tAENV P95\tAENV P99\tBARE P50\tBARE P95\tBARE P99\tAENV/BARE P50\tBARE RUNSC DID")
	for _, row := range r.Rows {
		fmt.Fprintf(tw, "%s\t%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", row.Operation, row.Aenv.N, row.Bare.N,
			FormatDuration(row.Aenv.P50), FormatDuration(row.Aenv.P95), FormatDuration(row.Aenv.P99),
			FormatDuration(row.Bare.P50), FormatDuration(row.Bare.P95), FormatDuration(row.Bare.P99),
			FormatRatio(row.RatioP50), row.Baseline)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Figures) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "FIGURE\tAENV\tBARE\tAENV/BARE\tBARE RUNSC DID")
		for _, f := range r.Figures {
			fmt.Fprintf(tw, "%s\t%.1f %s\t%.1f %s\t%s\t%s\n", f.Name, f.Aenv, f.Unit, f.Bare, f.Unit, FormatRatio(f.Ratio), f.Baseline)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Sizes) > 0 {
		fmt.Fprintln(w, "\nsnapshot-suite sandboxes (memory cgroup usage while running; saved image):")
		for _, s := range r.Sizes {
			fmt.Fprintf(w, "  %s: aenv %.1f MiB, image %.1f MiB; bare %.1f MiB, image %.1f MiB\n",
				s.Name, s.AenvMemoryMiB, s.AenvImageMiB, s.BareMemoryMiB, s.BareImageMiB)
		}
	}
	if m := r.Memory; m != nil {
		fmt.Fprintf(w, "\nmemory, %d small sandboxes paused one by one, then resumed:\n", m.Sandboxes)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  STAGE\tHOST MemAvailable\tHOST Shmem\tSANDBOX CGROUPS\tCGROUP USAGE (SUM)")
		for _, st := range []struct {
			name string
			s    MemoryStage
		}{{"running", m.Running}, {"paused", m.Paused}, {"resumed", m.Resumed}} {
			fmt.Fprintf(tw, "  %s\t%.1f MiB\t%.1f MiB\t%d\t%.1f MiB\n", st.name, st.s.AvailableMiB, st.s.ShmemMiB, st.s.Cgroups, st.s.CgroupMiB)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "  freed by pausing: %.1f MiB of host memory per sandbox (a running one's cgroup: %.1f MiB)\n",
			m.FreedPerSandboxMiB, m.CgroupPerSandboxMiB)
		fmt.Fprintf(w, "  pause p50 %s, resume p50 %s\n", FormatDuration(m.Pause.P50), FormatDuration(m.Resume.P50))
		for _, p := range m.LeftProcesses {
			fmt.Fprintf(w, "  process left by a paused sandbox: %s\n", p)
		}
	}
	if len(r.Targets) > 0 {
		fmt.Fprintln(w, "\ntargets:")
		for _, t := range r.Targets {
			verdict := "met"
			if !t.Met {
				verdict = "MISSED"
			}
			fmt.Fprintf(w, "  %-6s %s: %s\n", verdict, t.Name, t.Value)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\nnote: %s\n", n)
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

// BatchTarget is the wall time a batch create of 100 from the warm pool
// may take.
const BatchTarget = 2 * time.Second

// AddBatch adds the batch suite's rows: a batch create and as many single
// creates at once, beside as many bare `runsc run` at once (bare, wall
// times).
func (r *Report) AddBatch(res *BatchResult, bare []time.Duration) {
	base := fmt.Sprintf("runsc run /bin/true, %d at once (wall)", res.Size)
	batch := newRow(fmt.Sprintf("batch create of %d, all ready (%s at least)", res.Size, poolLabel(res.PoolHeld)), base, res.Batch, bare)
	r.Rows = append(r.Rows, batch,
		newRow(fmt.Sprintf("%d single creates at once, all ready", res.Size), base, res.Parallel, bare))
	if res.Size >= 100 {
		r.Targets = append(r.Targets, Target{
			Name:  fmt.Sprintf("batch create of %d: p50 <= %v wall", res.Size, BatchTarget),
			Value: FormatDuration(batch.Aenv.P50),
			Met:   batch.Aenv.N > 0 && batch.Aenv.P50 <= BatchTarget,
		})
	}
}

// AddRunCode adds the code interpreter's rows, beside the bare round trip
// into a sandbox and the bare start (b, from the create suite).
func (r *Report) AddRunCode(res RunCodeResults, b BareResults) {
	rt := newRow("runCode('1+1') round trip", "runsc exec /bin/true", res.RunCode, b.Exec)
	first := newRow("code-interpreter create to first runCode result", "runsc run /bin/true", res.FirstResult, b.RunSerial)
	r.Rows = append(r.Rows, rt, first)
	r.Targets = append(r.Targets,
		Target{Name: "runCode('1+1') round trip: p50 <= 15ms", Value: FormatDuration(rt.Aenv.P50),
			Met: rt.Aenv.N > 0 && rt.Aenv.P50 <= 15*time.Millisecond},
		Target{Name: "code-interpreter create to first result: p50 <= 300ms", Value: FormatDuration(first.Aenv.P50),
			Met: first.Aenv.N > 0 && first.Aenv.P50 <= 300*time.Millisecond})
}

// IdleTarget is what an idle sandbox may cost the host.
const IdleTarget = 12 << 20

// AddIdle adds what an idle sandbox costs, beside a bare one, and how many
// the cluster would hold before refusing (beside how many bare ones the
// host's available memory fits).
func (r *Report) AddIdle(res *IdleResult, bare BareIdle) {
	drop, held := res.AvailableDropPerSandbox(), res.Held()
	label := fmt.Sprintf("%d python3 asleep", res.Sandboxes)
	r.Figures = append(r.Figures,
		newFigure("host memory per idle sandbox (MemAvailable drop, "+label+")", "MiB",
			fmt.Sprintf("runsc run python3 asleep, %d detached", bare.Sandboxes), mib(drop), mib(bare.AvailableDrop)),
		newFigure("memory cgroup per idle sandbox (median, "+label+")", "MiB",
			"the same, its cgroup", mib(idleMedian(res.Each, cgroupKey("usage"))), mib(bare.Cgroup)),
		newFigure("host CPU per idle sandbox ("+label+")", "CPU-ms/s",
			"the same, bare", res.CPUPerSandbox()*1000, bare.CPU*1000))
	fits := 0.0
	if bare.AvailableDrop > 0 {
		fits = float64(bare.Available / bare.AvailableDrop)
	}
	name := fmt.Sprintf("idle sandboxes held before admission refuses (memoryMB %d, overcommit %g, %s binds first)",
		held.MemoryMB, held.Overcommit, held.Bound)
	r.Figures = append(r.Figures, newFigure(name, "sandboxes",
		"bare idle sandboxes the host's MemAvailable fits", float64(held.Max), fits))
	r.Targets = append(r.Targets,
		Target{Name: "host memory per idle sandbox <= 12 MiB", Value: mibText(drop) + " MiB",
			Met: drop > 0 && drop <= IdleTarget},
		Target{Name: "idle sandboxes held before refusal >= 1,000", Value: fmt.Sprint(held.Max),
			Met: held.Max >= 1000})
}
