package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/bench"
	"github.com/aenvhq/aenv/internal/client"
)

// defaultBaseRootFS is where `make base` puts the base template's root
// filesystem.
const defaultBaseRootFS = "/var/cache/aenv/base-rootfs"

// Bench suites.
const (
	suiteCreate   = "create"
	suiteSnapshot = "snapshot"
	suiteAll      = "all"
	suiteSoak     = "soak"
	suiteBatch    = "batch"
	suiteIdle     = "idle"
	suiteCode     = "interpreter"
)

func newBenchCmd() *cobra.Command {
	var opts bench.Options
	var output, suite, reportDir string
	var soakCycles, soakRounds, batchSize, batchRounds int
	var interpreterTemplate string
	var idle bench.IdleOptions
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox latency against bare runsc",
		Long: `Measure a running server (--url, --key-file), then the same work with bare runsc
on this host, on the template's root filesystem and with the server's runsc
flags, and print both with their ratio. Run it as root on the server's host,
with the server idle.

The create suite: create to first command one at a time (each once the warm
pool has caught up, as for one user's creates seconds apart) and --concurrency
at once, the round trip of a command in a running sandbox, two bursts of
--burst creates at once (as the warm pool stands, then once it has refilled
from what the first taught it, waiting at most 2 minutes), one at a time again
but back to back (each create right after the last one's kill, as a client
creating sandboxes in a loop does), and the creates per second
--concurrency clients sustain for --sustain; beside bare runsc doing the same,
with the host CPU-seconds one create costs (read from /proc/stat: keep the host
otherwise idle).

The snapshot suite, for a fresh sandbox and one holding 256 MiB of written
memory: snapshot (leaving it running), pause, resume (and its first
command), create from a snapshot, and fork of 1, 4 and 16 children, and 16
once more after the warm pool has prepared sandboxes for them (as it does for
a loop that forks 16 each step; waiting at most 2 minutes); then
what pausing --pause-count sandboxes frees, read from /proc/meminfo and the
sandboxes' memory cgroups under --cgroup-parent (the server's --netns-tag).
Its aenv and bare samples alternate, so that both see the same load on the
host. It makes the snapshot requests itself, so it takes the key from --key-file,
AENV_API_KEY, E2B_API_KEY or the local server's key file, not from 'aenv auth'.

The soak suite (not part of all) runs --soak-rounds rounds of --soak-cycles
create/exec/kill cycles, --concurrency at a time, and prints the server's
live Go heap (at its last GC), heap in use, resident memory, goroutines and
open files (from its /metrics) before the first round and after each: a
leak per sandbox shows as growth that goes on round after round.

The batch suite times, --batch-rounds rounds, one batch create of
--batch-size sandboxes (POST /sandboxes/batch) against as many single
creates at once, until all are ready, alternately; in all, beside as many
bare runsc run at once.

The interpreter suite times runCode('1+1') in a sandbox of
--interpreter-template, and create to its first result, beside bare runsc
exec and run. All leaves it out, saying so, when the server has no such
template.

The idle suite holds --idle-count sandboxes, each running a sleeping
python3, and prints what one costs the host: the drop of MemAvailable per
sandbox (flagged LOW when below a sandbox's own cgroup: memory freed
elsewhere during the run, such as a server stopped just before), and the
median of each part of it (the sandbox's memory cgroup under
--cgroup-parent, the sentry, gofer and stub processes' RSS, PSS and
private memory, page tables, the guest's envd), the CPU one keeps busy
(the host's busy cores it adds, and the median of what each uses in its
own cpuacct cgroup, which leaves out a warm pool booting meanwhile), and
how many the cluster would hold before admission refused one, by the
nodes' rules. In all, beside as many bare runsc sandboxes with a sleeping
python3.

All runs create, interpreter, batch, snapshot and idle, in that order, into
one report.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("unknown --output %q (table or json)", output)
			}
			if reportDir != "" && (suite == suiteBatch || suite == suiteSoak || suite == suiteIdle) {
				return fmt.Errorf("--report writes the report of all, create, snapshot or interpreter, not the %s suite's table", suite)
			}
			if suite == suiteIdle {
				return runIdleSuite(cmd, idle, opts, output)
			}
			if suite == suiteBatch {
				c, err := globalsOf(cmd).client()
				if err != nil {
					return err
				}
				var progress io.Writer
				if isTerminal(cmd.ErrOrStderr()) {
					progress = cmd.ErrOrStderr()
				}
				res, err := bench.MeasureBatch(cmd.Context(), c, opts.Template, batchSize, batchRounds, progress)
				if err != nil {
					return err
				}
				if output == "json" {
					return writeJSON(cmd.OutOrStdout(), res)
				}
				return res.WriteTable(cmd.OutOrStdout())
			}
			if suite == suiteSoak {
				// The soak suite has no bare half: it watches the server.
				c, err := globalsOf(cmd).client()
				if err != nil {
					return err
				}
				var progress io.Writer
				if isTerminal(cmd.ErrOrStderr()) {
					progress = cmd.ErrOrStderr()
				}
				res, err := bench.Soak(cmd.Context(), c, opts.Template,
					bench.SoakOptions{Cycles: soakCycles, Rounds: soakRounds, Concurrency: opts.Concurrency}, progress)
				if err != nil {
					return err
				}
				if output == "json" {
					return writeJSON(cmd.OutOrStdout(), res)
				}
				return res.WriteTable(cmd.OutOrStdout())
			}
			runs, err := benchSuites(suite)
			if err != nil {
				return err
			}
			if opts.RunscPath == "" {
				p, err := exec.LookPath("runsc")
				if err != nil {
					return fmt.Errorf("finding runsc: %w (pass --runsc)", err)
				}
				opts.RunscPath = p
			}
			if opts.EnvdPath == "" {
				opts.EnvdPath = findBenchEnvd()
			}
			if err := bench.CheckBare(opts); err != nil {
				return err
			}
			if (runs.snapshot && opts.PauseCount >= 0) || runs.idle {
				if err := checkCgroupParent(opts.CgroupParent); err != nil {
					return err
				}
			}
			api, err := benchAPI(globalsOf(cmd))
			if err != nil {
				return err
			}
			opts.API, opts.Snapshots = api, api
			opts.Notes = cmd.ErrOrStderr()
			if isTerminal(cmd.ErrOrStderr()) {
				// A line rewritten with \r is noise in a log file.
				opts.Progress = cmd.ErrOrStderr()
			}

			ctx := cmd.Context()
			report := bench.NewReport(opts, runtime.NumCPU())
			var bare bench.BareResults
			if runs.create {
				a, err := bench.MeasureAenv(ctx, opts)
				if err != nil {
					return err
				}
				// Size the bare containers like the server sized its sandboxes.
				opts.CPUCount, opts.MemoryMB = a.CPUCount, a.MemoryMB
				if bare, err = bench.MeasureBare(ctx, opts); err != nil {
					return err
				}
				report.AddCreate(opts, a, bare)
			}
			if runs.interpreter {
				if err := benchInterpreter(ctx, api.Client, &report, opts, bare, interpreterTemplate, suite == suiteAll); err != nil {
					return err
				}
			}
			if runs.batch {
				if err := benchBatch(ctx, api.Client, &report, opts, batchSize, batchRounds); err != nil {
					return err
				}
			}
			if runs.snapshot {
				// Both halves at once, sample by sample; the bare
				// containers are sized like the server's sandboxes.
				res, err := bench.MeasureSnapshot(ctx, opts)
				if err != nil {
					return err
				}
				report.AddSnapshot(opts, res)
			}
			if runs.idle {
				if err := benchIdle(ctx, api.Client, &report, idleOptions(idle, opts, opts.Progress), opts); err != nil {
					return err
				}
			}
			if reportDir != "" {
				if err := writeBenchReport(reportDir, report); err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "report written to %s (bench.json, bench.txt, bench.svg)\n", reportDir)
			}
			if output == "json" {
				return report.WriteJSON(cmd.OutOrStdout())
			}
			return report.WriteTable(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&suite, "suite", suiteAll, "what to measure: all (create, interpreter, batch, snapshot and idle), one of those, or soak (not in all)")
	f.IntVar(&idle.Count, "idle-count", bench.DefaultIdleCount, "sandboxes the idle suite holds at once")
	f.DurationVar(&idle.Settle, "idle-settle", bench.DefaultIdleSettle, "how long the idle suite leaves its sandboxes alone before reading them")
	f.IntVar(&batchSize, "batch-size", 100, "sandboxes per batch of the batch suite")
	f.IntVar(&batchRounds, "batch-rounds", 3, "rounds of the batch suite (a batch, then as many single creates)")
	f.StringVar(&interpreterTemplate, "interpreter-template", bench.DefaultInterpreterTemplate, "template the interpreter suite runs code in")
	f.IntVar(&soakCycles, "soak-cycles", 1000, "create/exec/kill cycles of the soak suite (--concurrency at a time)")
	f.IntVar(&soakRounds, "soak-rounds", 5, "rounds of --soak-cycles the soak suite runs, reading the server's heap and RSS after each")
	f.IntVarP(&opts.Iterations, "iterations", "n", bench.DefaultIterations, "samples per operation of the create suite")
	f.IntVar(&opts.Concurrency, "concurrency", bench.DefaultConcurrency, "sandboxes started at once in the concurrent measurement, and clients of the sustained rate")
	f.IntVar(&opts.BurstSize, "burst", bench.DefaultBurstSize, "sandboxes the create suite's two bursts start at once, the second after the warm pool refilled (0: none)")
	f.DurationVar(&opts.SustainFor, "sustain", bench.DefaultSustainFor, "how long the create suite measures the sustained create rate (0: not measured)")
	f.IntVar(&opts.SnapshotIterations, "snapshot-iterations", bench.DefaultSnapshotIterations, "samples per operation of the snapshot suite (forks of 4 and 16 take fewer)")
	f.IntVar(&opts.PauseCount, "pause-count", bench.DefaultPauseCount, "small sandboxes held paused together to measure the memory pausing frees (negative: skip)")
	f.StringVar(&opts.CgroupParent, "cgroup-parent", bench.DefaultCgroupParent, "the server's --netns-tag: its sandboxes' memory cgroups are /sys/fs/cgroup/memory/<this>/<id>")
	f.StringVar(&opts.Template, "template", bench.DefaultTemplate, "template to create sandboxes from")
	f.StringVar(&opts.FastPath, "systrap-fast-path", "auto", "the server's --systrap-fast-path, which the bare baseline runs with too (auto, on or off)")
	f.StringVar(&opts.RunscPath, "runsc", "", "runsc binary for the bare baseline, the one the server uses (default: from PATH)")
	f.StringVar(&opts.EnvdPath, "envd", "", "envd binary the bare snapshot baseline runs, as the server's sandboxes do (default: beside aenv, then PATH; none: sleep)")
	f.StringVar(&opts.RootFS, "rootfs", firstNonEmpty(os.Getenv("AENV_BASE_ROOTFS"), defaultBaseRootFS),
		"the template's root filesystem, for the bare baseline (env AENV_BASE_ROOTFS)")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	f.StringVar(&reportDir, "report", "", "also write the report into this directory: bench.json, bench.txt (the table) and bench.svg (a chart of each operation's p50 against bare runsc's)")
	return cmd
}

// runIdleSuite runs the idle suite; it has no bare half. The sandboxes
// are created --concurrency at a time.
func runIdleSuite(cmd *cobra.Command, idle bench.IdleOptions, opts bench.Options, output string) error {
	if err := checkCgroupParent(opts.CgroupParent); err != nil {
		return err
	}
	c, err := globalsOf(cmd).client()
	if err != nil {
		return err
	}
	var progress io.Writer
	if isTerminal(cmd.ErrOrStderr()) {
		progress = cmd.ErrOrStderr()
	}
	res, err := bench.MeasureIdle(cmd.Context(), c, idleOptions(idle, opts, progress))
	if err != nil {
		return err
	}
	if output == "json" {
		return writeJSON(cmd.OutOrStdout(), res)
	}
	return res.WriteTable(cmd.OutOrStdout())
}

// idleOptions is the idle suite's options with the run's template,
// cgroup parent, concurrency and progress.
func idleOptions(idle bench.IdleOptions, opts bench.Options, progress io.Writer) bench.IdleOptions {
	idle.Template, idle.CgroupParent, idle.Concurrency, idle.Progress = opts.Template, opts.CgroupParent, opts.Concurrency, progress
	return idle
}

// writeBenchReport writes r into dir as JSON, a table and a chart, each
// file whole or not at all.
func writeBenchReport(dir string, r bench.Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("writing the bench report: %w", err)
	}
	for name, write := range map[string]func(io.Writer) error{
		"bench.json": r.WriteJSON, "bench.txt": r.WriteTable, "bench.svg": r.WriteSVG,
	} {
		var b bytes.Buffer
		if err := write(&b); err != nil {
			return fmt.Errorf("writing the bench report's %s: %w", name, err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path+".tmp", b.Bytes(), 0o644); err != nil {
			return fmt.Errorf("writing the bench report: %w", err)
		}
		if err := os.Rename(path+".tmp", path); err != nil {
			return fmt.Errorf("writing the bench report: %w", err)
		}
	}
	return nil
}

// benchInterpreter adds the interpreter suite to report. With skipMissing
// (all), a server without the template adds a note instead of failing.
func benchInterpreter(ctx context.Context, c *client.Client, report *bench.Report, opts bench.Options, bare bench.BareResults, template string, skipMissing bool) error {
	res, err := bench.MeasureRunCode(ctx, c, template, opts.Iterations, min(opts.Iterations, 10), opts.Progress)
	if err != nil {
		if skipMissing && client.IsStatus(err, http.StatusNotFound) {
			report.Notes = append(report.Notes, fmt.Sprintf("runCode not measured: the server has no template %s (aenv server --code-interpreter-rootfs)", template))
			return nil
		}
		return err
	}
	report.AddRunCode(res, bare)
	return nil
}

// benchBatch adds the batch suite to report, beside bare runsc.
func benchBatch(ctx context.Context, c *client.Client, report *bench.Report, opts bench.Options, size, rounds int) error {
	res, err := bench.MeasureBatch(ctx, c, opts.Template, size, rounds, opts.Progress)
	if err != nil {
		return err
	}
	bare, err := bench.MeasureBareWall(ctx, opts, size, rounds)
	if err != nil {
		return err
	}
	report.AddBatch(res, bare)
	return nil
}

// benchIdle adds the idle suite to report, beside as many bare sandboxes.
func benchIdle(ctx context.Context, c *client.Client, report *bench.Report, idle bench.IdleOptions, opts bench.Options) error {
	res, err := bench.MeasureIdle(ctx, c, idle)
	if err != nil {
		return err
	}
	bare, err := bench.MeasureBareIdle(ctx, opts, res.Sandboxes, idle.Concurrency, res.Settle)
	if err != nil {
		return err
	}
	report.AddIdle(res, bare)
	return nil
}

// suites are the parts of the report a run measures.
type suites struct{ create, interpreter, batch, snapshot, idle bool }

// benchSuites parses --suite (soak is handled before it).
func benchSuites(suite string) (suites, error) {
	switch suite {
	case suiteCreate:
		return suites{create: true}, nil
	case suiteSnapshot:
		return suites{snapshot: true}, nil
	case suiteCode:
		// Without the create suite's bare baselines: all has them.
		return suites{interpreter: true}, nil
	case suiteAll:
		return suites{true, true, true, true, true}, nil
	}
	return suites{}, fmt.Errorf("unknown --suite %q (all, create, interpreter, batch, snapshot, idle or soak)", suite)
}

// benchAPI finds the server as every client command does.
// globalsOf reads the persistent client flags from cmd's parsed flags,
// for a command built without the shared globals (bench).
func globalsOf(cmd *cobra.Command) *globals {
	g := &globals{}
	g.url, _ = cmd.Flags().GetString("url")
	g.keyFile, _ = cmd.Flags().GetString("key-file")
	g.caFile, _ = cmd.Flags().GetString("ca-file")
	return g
}

func benchAPI(g *globals) (*bench.HTTPAPI, error) {
	c, err := g.client()
	if err != nil {
		return nil, err
	}
	return &bench.HTTPAPI{Client: c}, nil
}

// findBenchEnvd looks for envd beside this binary, then in PATH; "" when
// there is none.
func findBenchEnvd() string {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "envd")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("envd")
	return p
}

// checkCgroupParent fails early when the server's cgroup parent is not
// there: the memory measurement would otherwise find no sandbox cgroups.
func checkCgroupParent(parent string) error {
	p := filepath.Join("/sys/fs/cgroup/memory", parent)
	if _, err := os.Stat(p); err != nil {
		return fmt.Errorf("checking --cgroup-parent: %w (pass the server's --netns-tag)", err)
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
