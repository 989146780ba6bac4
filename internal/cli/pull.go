package cli

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/aenvhq/aenv/internal/client"
)

func newPullCmd(g *globals) *cobra.Command {
	var (
		name, startCmd, readyCmd string
		cpu, memory              int
		insecure                 bool
	)
	cmd := &cobra.Command{
		Use:   "pull REF --name NAME",
		Short: "Make a template from an OCI image",
		Long: `Make the server pull an OCI image and publish it as the template NAME.

REF names where the image is, as skopeo does:
  docker://REF or REF           a registry ('ubuntu:22.04' is Docker Hub's
                                library/ubuntu:22.04), pulled by the server;
                                with the credentials the server was given
                                (aenv server --registry-auth), else none
  oci:PATH[:TAG]                an OCI layout directory on this machine,
                                uploaded to the server
  docker-archive:PATH[:REF]     a 'docker save' tarball on this machine,
                                uploaded to the server

An index resolves to its linux/amd64 image. The image must have a shell
(/bin/sh); the template gets the user 'user' (uid 1000) if it lacks one.
A pull that fails or is interrupted leaves no template behind, and an
existing template of the same name stays until the new one is complete.
The template id is printed on stdout. Only --url and a key (--key-file) are needed: the
server may be on another host.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return fmt.Errorf("--name is required: the template to create from %s", args[0])
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ref := args[0]
			src, cleanup, err := pullSource(ref)
			if err != nil {
				return err
			}
			defer cleanup()
			prog := newPullProgress(cmd.ErrOrStderr(), ref)
			res, err := c.PullTemplate(cmd.Context(), src, client.ImportOptions{
				Name: name, CPUCount: cpu, MemoryMB: memory,
				StartCmd: startCmd, ReadyCmd: readyCmd, Insecure: insecure,
			}, client.ImportEvents{Progress: prog.update})
			prog.finish(err)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "pulled %s (%s): %d layers, %s in %s\n",
				ref, res.Digest, res.Layers, formatBytes(res.Bytes), (time.Duration(res.DurationMs) * time.Millisecond).Round(100*time.Millisecond))
			fmt.Fprintln(cmd.OutOrStdout(), res.TemplateID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "template id to create or replace (required)")
	f.IntVar(&cpu, "cpu", client.DefaultCPUCount, "default vCPUs of the template's sandboxes")
	f.IntVar(&memory, "memory", client.DefaultMemoryMB, "default memory of the template's sandboxes, MiB")
	f.StringVar(&startCmd, "start-cmd", "", "command that starts the template's service: the node runs it once, snapshots the sandbox when --ready-cmd succeeds, and starts the template's sandboxes from that snapshot with the service up")
	f.StringVar(&readyCmd, "ready-cmd", "", "command that succeeds once the service is up (polled every 100 ms, for up to 3 minutes)")
	f.BoolVar(&insecure, "insecure", false, "allow plain HTTP and unverified TLS to the registry (needs an admin key; localhost registries get HTTP anyway)")
	return cmd
}

// pullSource turns REF into what the server is sent: a registry
// reference as it is, or a local OCI layout (as a tar stream made on the
// fly) or docker archive (the file) to upload.
func pullSource(ref string) (client.PullSource, func(), error) {
	nop := func() {}
	if rest, ok := strings.CutPrefix(ref, "oci:"); ok {
		dir, sel := splitLocalRef(rest)
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return client.PullSource{}, nop, fmt.Errorf("OCI layout %s: not a directory on this machine", dir)
		}
		r := tarDir(dir, "", nil)
		return client.PullSource{Format: "oci", Ref: sel, Body: r}, func() { r.Close() }, nil
	}
	if rest, ok := strings.CutPrefix(ref, "docker-archive:"); ok {
		file, sel := splitLocalRef(rest)
		f, err := os.Open(file)
		if err != nil {
			return client.PullSource{}, nop, fmt.Errorf("docker archive: %w", err)
		}
		return client.PullSource{Format: "docker-archive", Ref: sel, Body: f}, func() { f.Close() }, nil
	}
	return client.PullSource{Ref: ref}, nop, nil
}

// splitLocalRef splits PATH[:REF]: the longest prefix that exists on this
// machine is the path (REF may have colons of its own).
func splitLocalRef(s string) (path, ref string) {
	if _, err := os.Stat(s); err == nil {
		return s, ""
	}
	for i := len(s) - 1; i > 0; i-- {
		if s[i] == ':' {
			if _, err := os.Stat(s[:i]); err == nil {
				return s[:i], s[i+1:]
			}
		}
	}
	return s, ""
}

// tarDir streams dir as a tar archive of its directories, regular files
// and symlinks, relative to dir, and one more file, extraName holding
// extra, when extraName is set. It is written as it is read: an upload
// of a large directory needs no temporary copy.
func tarDir(dir, extraName string, extra []byte) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := tw.AddFS(os.DirFS(dir))
		if err == nil && extraName != "" {
			if err = tw.WriteHeader(&tar.Header{Name: extraName, Mode: 0o644, Size: int64(len(extra)), Typeflag: tar.TypeReg}); err == nil {
				_, err = tw.Write(extra)
			}
		}
		if cerr := tw.Close(); err == nil {
			err = cerr
		}
		pw.CloseWithError(err)
	}()
	return pr
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

func (p *pullProgress) update(e client.PullProgress) {
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
