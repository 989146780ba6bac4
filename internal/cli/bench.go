package cli

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/bench"
)

// defaultBaseRootFS is where `make base` puts the base template's root
// filesystem.
const defaultBaseRootFS = "/var/cache/aenv/base-rootfs"

func newBenchCmd() *cobra.Command {
	var opts bench.Options
	var output string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure sandbox latency against bare runsc",
		Long: `Measure a running server (--url, --key): create to first command one at a
time and --concurrency at once, and the round trip of a command in a running
sandbox. Then measure the same work with bare runsc on this host, on the
template's root filesystem and with the server's runsc flags, and print both
with their ratio. Run it as root on the server's host, with the server idle.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("unknown --output %q (table or json)", output)
			}
			if opts.RunscPath == "" {
				p, err := exec.LookPath("runsc")
				if err != nil {
					return fmt.Errorf("finding runsc: %w (pass --runsc)", err)
				}
				opts.RunscPath = p
			}
			if err := bench.CheckBare(opts); err != nil {
				return err
			}
			// The bench command is built without the shared globals; the
			// persistent --url and --key are read from the parsed flags.
			g := &globals{}
			g.url, _ = cmd.Flags().GetString("url")
			g.key, _ = cmd.Flags().GetString("key")
			c, err := g.client()
			if err != nil {
				return err
			}
			opts.API = c
			if isTerminal(cmd.ErrOrStderr()) {
				// A line rewritten with \r is noise in a log file.
				opts.Progress = cmd.ErrOrStderr()
			}

			ctx := cmd.Context()
			a, err := bench.MeasureAenv(ctx, opts)
			if err != nil {
				return err
			}
			// Size the bare containers like the server sized its sandboxes.
			opts.CPUCount, opts.MemoryMB = a.CPUCount, a.MemoryMB
			b, err := bench.MeasureBare(ctx, opts)
			if err != nil {
				return err
			}
			report := bench.NewReport(opts, runtime.NumCPU(), a, b)
			if output == "json" {
				return report.WriteJSON(cmd.OutOrStdout())
			}
			return report.WriteTable(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.IntVarP(&opts.Iterations, "iterations", "n", bench.DefaultIterations, "samples per operation")
	f.IntVar(&opts.Concurrency, "concurrency", bench.DefaultConcurrency, "sandboxes started at once in the concurrent measurement")
	f.StringVar(&opts.Template, "template", bench.DefaultTemplate, "template to create sandboxes from")
	f.StringVar(&opts.RunscPath, "runsc", "", "runsc binary for the bare baseline, the one the server uses (default: from PATH)")
	f.StringVar(&opts.RootFS, "rootfs", firstNonEmpty(os.Getenv("AENV_BASE_ROOTFS"), defaultBaseRootFS),
		"the template's root filesystem, for the bare baseline (env AENV_BASE_ROOTFS)")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
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
