package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newBuildCmd(g *globals) *cobra.Command {
	var (
		name, contextDir, startCmd, readyCmd string
		buildArgs                            []string
		cpu, memory                          int
		insecure                             bool
	)
	cmd := &cobra.Command{
		Use:   "build DOCKERFILE --name NAME",
		Short: "Make a template from a Dockerfile",
		Long: `Make the server build the template NAME from a Dockerfile. The build
context (--context, default the Dockerfile's directory) is uploaded, so the
server may be on another host: only --url and a key (--key-file) are needed.

Supported: one FROM, then RUN (shell and JSON form), ENV, ARG (with
defaults and --build-arg), WORKDIR, USER, COPY (--chown; sources from the
build context only), CMD and ENTRYPOINT (recorded). EXPOSE, LABEL, VOLUME,
MAINTAINER and STOPSIGNAL are ignored; anything else (ADD, multi-stage
builds, RUN --mount, ...) is an error.

FROM names an existing template (such as 'base'), whose files are copied,
or else an OCI image, pulled as 'aenv pull' does.

Each RUN runs in a gVisor sandbox writing straight into the new template's
files, as root or the USER, with the ENV, ARG and WORKDIR so far. RUN steps
have no network access yet: install what you need from the FROM image or
COPY it in. /tmp is a fresh tmpfs in every step (as in sandboxes), so
files left there are not part of the template. The build log goes to
stderr as the server runs it; a failing step stops the build (aenv build
exits with its exit code) and leaves no template, and an existing template
of the same name stays until the new one is complete. The template id is
printed on stdout.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return fmt.Errorf("--name is required: the template to build from %s", args[0])
			}
			if _, err := os.Stat(args[0]); err != nil {
				return err
			}
			if contextDir == "" {
				contextDir = filepath.Dir(args[0])
			}
			bargs := map[string]string{}
			for _, a := range buildArgs {
				k, v, ok := strings.Cut(a, "=")
				if !ok {
					// Like docker: a bare name takes its value from the
					// environment.
					v, ok = os.LookupEnv(k)
					if !ok {
						continue
					}
				}
				bargs[k] = v
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			body, dockerfile, err := contextTar(contextDir, args[0])
			if err != nil {
				return err
			}
			defer body.Close()
			stderr := cmd.ErrOrStderr()
			res, err := c.BuildTemplate(cmd.Context(), body, client.BuildOptions{
				ImportOptions: client.ImportOptions{
					Name: name, CPUCount: cpu, MemoryMB: memory,
					StartCmd: startCmd, ReadyCmd: readyCmd, Insecure: insecure,
				},
				Dockerfile: dockerfile,
				BuildArgs:  bargs,
			}, client.ImportEvents{Log: func(line string) { fmt.Fprintln(stderr, line) }})
			// A failing RUN's exit code is the command's.
			var ie *client.ImportError
			if errors.As(err, &ie) && ie.ExitCode > 0 {
				return &codeError{code: ie.ExitCode, err: err}
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.TemplateID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "template id to create or replace (required)")
	f.StringVar(&contextDir, "context", "", "directory COPY reads from, uploaded to the server (default: the Dockerfile's directory)")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "set a declared ARG: NAME=VALUE (repeatable)")
	f.IntVar(&cpu, "cpu", client.DefaultCPUCount, "default vCPUs of the template's sandboxes")
	f.IntVar(&memory, "memory", client.DefaultMemoryMB, "default memory of the template's sandboxes, MiB")
	f.StringVar(&startCmd, "start-cmd", "", "command that starts the template's service: the node runs it once, snapshots the sandbox when --ready-cmd succeeds, and starts the template's sandboxes from that snapshot with the service up")
	f.StringVar(&readyCmd, "ready-cmd", "", "command that succeeds once the service is up (polled every 100 ms, for up to 3 minutes)")
	f.BoolVar(&insecure, "insecure", false, "allow plain HTTP and unverified TLS to the FROM image's registry (needs an admin key)")
	return cmd
}

// outsideDockerfile is where a Dockerfile from outside the context goes
// in the uploaded context.
const outsideDockerfile = ".aenv-dockerfile"

// contextTar streams the build context as a tar archive, with the
// Dockerfile in it, and returns the Dockerfile's path inside.
func contextTar(contextDir, dockerfile string) (io.ReadCloser, string, error) {
	absCtx, err := filepath.Abs(contextDir)
	if err != nil {
		return nil, "", err
	}
	absDf, err := filepath.Abs(dockerfile)
	if err != nil {
		return nil, "", err
	}
	inside, err := filepath.Rel(absCtx, absDf)
	var extra []byte
	if err != nil || !filepath.IsLocal(inside) {
		if extra, err = os.ReadFile(absDf); err != nil {
			return nil, "", err
		}
		inside = outsideDockerfile
	}
	if fi, err := os.Stat(absCtx); err != nil || !fi.IsDir() {
		return nil, "", fmt.Errorf("build context %s: not a directory", contextDir)
	}
	extraName := ""
	if extra != nil {
		extraName = outsideDockerfile
	}
	return tarDir(absCtx, extraName, extra), filepath.ToSlash(inside), nil
}
