package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/aenvhq/aenv/internal/image"
	"github.com/aenvhq/aenv/internal/template"
)

func newPullCmd() *cobra.Command {
	var (
		name, dataDir, startCmd, readyCmd string
		cpu, memory                       int
		insecure                          bool
	)
	cmd := &cobra.Command{
		Use:   "pull REF --name NAME",
		Short: "Make a template from an OCI image",
		Long: `Pull an OCI image and make it the template NAME, on the server's host.

REF names where the image is, as skopeo does:
  docker://REF or REF           a registry ('ubuntu:22.04' is Docker Hub's
                                library/ubuntu:22.04); credentials come from
                                the docker config (docker login)
  oci:PATH[:TAG]                an OCI layout directory
  docker-archive:PATH[:REF]     a 'docker save' tarball

An index resolves to its linux/amd64 image. The image must have a shell
(/bin/sh); the template gets the user 'user' (uid 1000) if it lacks one.
A pull that fails or is interrupted leaves no template behind, and an
existing template of the same name stays until the new one is complete.
The server picks the template up on the next create; the template id is
printed on stdout.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return fmt.Errorf("--name is required: the template to create from %s", args[0])
			}
			store, err := template.NewStore(template.StoreOptions{Dir: filepath.Join(dataDir, "templates")})
			if err != nil {
				return err
			}
			ref := args[0]
			prog := newPullProgress(cmd.ErrOrStderr(), ref)
			res, err := image.Pull(cmd.Context(), ref, image.PullOptions{
				Store: store,
				Template: template.Template{
					ID: name, CPUCount: cpu, MemoryMB: memory,
					StartCmd: startCmd, ReadyCmd: readyCmd,
				},
				Insecure: insecure,
				Progress: prog.update,
			})
			prog.finish(err)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "pulled %s (%s): %d layers, %s in %s\n",
				ref, res.Digest, res.Layers, formatBytes(res.Bytes), res.Duration.Round(100*time.Millisecond))
			fmt.Fprintln(cmd.OutOrStdout(), res.Template.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "template id to create or replace (required)")
	f.IntVar(&cpu, "cpu", image.DefaultCPUCount, "default vCPUs of the template's sandboxes")
	f.IntVar(&memory, "memory", image.DefaultMemoryMB, "default memory of the template's sandboxes, MiB")
	f.StringVar(&startCmd, "start-cmd", "", "command that starts the template's service (recorded; not run yet)")
	f.StringVar(&readyCmd, "ready-cmd", "", "command that succeeds once the service is up (recorded; not run yet)")
	f.BoolVar(&insecure, "insecure", false, "allow plain HTTP and unverified TLS to the registry (localhost registries get HTTP anyway)")
	f.StringVar(&dataDir, "data-dir", defaultDataDir, "the server's data directory; the template goes into <data-dir>/templates")
	return cmd
}

// pullProgress shows a pull's progress: a bar on a terminal, a line per
// layer event otherwise (logs, CI).
type pullProgress struct {
	w       io.Writer
	ref     string
	tty     bool
	bar     *progressbar.ProgressBar
	started bool
	fetched []bool
	unpack  int
}

func newPullProgress(w io.Writer, ref string) *pullProgress {
	f, ok := w.(*os.File)
	return &pullProgress{w: w, ref: ref, tty: ok && term.IsTerminal(int(f.Fd()))}
}

func (p *pullProgress) update(e image.Progress) {
	if !p.started {
		p.started = true
		p.fetched = make([]bool, e.Layers)
		if p.tty {
			p.bar = progressbar.NewOptions64(e.ImageTotal,
				progressbar.OptionSetWriter(p.w),
				progressbar.OptionShowBytes(true),
				progressbar.OptionSetWidth(30),
				progressbar.OptionThrottle(100*time.Millisecond),
				progressbar.OptionSetPredictTime(true),
				progressbar.OptionClearOnFinish(),
				progressbar.OptionSetDescription(fmt.Sprintf("%s: layer 1/%d", p.ref, e.Layers)),
			)
		} else {
			fmt.Fprintf(p.w, "pulling %s: %d layers, %s\n", p.ref, e.Layers, formatBytes(e.ImageTotal))
		}
	}
	if p.tty {
		if e.Unpacked {
			p.unpack++
			if p.unpack < e.Layers {
				p.bar.Describe(fmt.Sprintf("%s: layer %d/%d", p.ref, p.unpack+1, e.Layers))
			} else {
				p.bar.Describe(p.ref + ": finishing")
			}
		}
		// Unpacking trails the download and is what the pull waits for.
		_ = p.bar.Set64(e.ImageApplied)
		return
	}
	if !p.fetched[e.Layer] && e.Total > 0 && e.Fetched >= e.Total {
		p.fetched[e.Layer] = true
		fmt.Fprintf(p.w, "layer %d/%d %s fetched (%s)\n", e.Layer+1, e.Layers, shortDigest(e.Digest), formatBytes(e.Total))
	}
	if e.Unpacked {
		fmt.Fprintf(p.w, "layer %d/%d unpacked\n", e.Layer+1, e.Layers)
	}
}

// finish removes the bar, or on failure leaves it where it stopped.
func (p *pullProgress) finish(err error) {
	if p.bar == nil {
		return
	}
	if err != nil {
		_ = p.bar.Exit()
		fmt.Fprintln(p.w)
		return
	}
	_ = p.bar.Finish()
}

func shortDigest(d string) string {
	if d == "" {
		return "-"
	}
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

func formatBytes(n int64) string {
	switch {
	case n < 0:
		return "unknown size"
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	case n < 1<<30:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	}
}
