package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/build"
	"github.com/aenvhq/aenv/internal/image"
	"github.com/aenvhq/aenv/internal/template"
)

func newBuildCmd() *cobra.Command {
	var (
		name, contextDir, dataDir, baseRootFS, runsc, startCmd, readyCmd string
		buildArgs                                                        []string
		cpu, memory                                                      int
		insecure                                                         bool
	)
	cmd := &cobra.Command{
		Use:   "build DOCKERFILE --name NAME",
		Short: "Make a template from a Dockerfile",
		Long: `Build the template NAME from a Dockerfile, on the server's host (as root).

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
files left there are not part of the template. The build log goes to stderr; a failing step stops the build
(aenv build exits with its exit code) and leaves no template, and an existing template of the
same name stays until the new one is complete. The template id is printed
on stdout.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name == "" {
				return fmt.Errorf("--name is required: the template to build from %s", args[0])
			}
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			df, err := build.Parse(f)
			f.Close()
			if err != nil {
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
			store, err := template.NewStore(template.StoreOptions{
				Dir: filepath.Join(dataDir, "templates"), BaseRootFS: baseRootFS,
			})
			if err != nil {
				return err
			}
			res, err := build.Run(cmd.Context(), df, build.Options{
				Host:  build.Host{RunscPath: runsc},
				Store: store,
				Template: template.Template{
					ID: name, CPUCount: cpu, MemoryMB: memory,
					StartCmd: startCmd, ReadyCmd: readyCmd,
				},
				ContextDir: contextDir,
				BuildArgs:  bargs,
				Insecure:   insecure,
				Log:        cmd.ErrOrStderr(),
			})
			// A failing RUN's exit code is the command's.
			var se *build.StepError
			if errors.As(err, &se) && se.ExitCode > 0 {
				return &codeError{code: se.ExitCode, err: err}
			}
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.Template.ID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&name, "name", "", "template id to create or replace (required)")
	f.StringVar(&contextDir, "context", "", "directory COPY reads from (default: the Dockerfile's directory)")
	f.StringArrayVar(&buildArgs, "build-arg", nil, "set a declared ARG: NAME=VALUE (repeatable)")
	f.IntVar(&cpu, "cpu", image.DefaultCPUCount, "default vCPUs of the template's sandboxes")
	f.IntVar(&memory, "memory", image.DefaultMemoryMB, "default memory of the template's sandboxes, MiB")
	f.StringVar(&startCmd, "start-cmd", "", "command that starts the template's service (recorded; not run yet)")
	f.StringVar(&readyCmd, "ready-cmd", "", "command that succeeds once the service is up (recorded; not run yet)")
	f.BoolVar(&insecure, "insecure", false, "allow plain HTTP and unverified TLS to the FROM image's registry")
	f.StringVar(&baseRootFS, "base-rootfs", os.Getenv("AENV_BASE_ROOTFS"), "the server's prebuilt base root filesystem, if it has one (env AENV_BASE_ROOTFS)")
	f.StringVar(&runsc, "runsc", "", "runsc binary (default: from PATH)")
	f.StringVar(&dataDir, "data-dir", defaultDataDir, "the server's data directory; the template goes into <data-dir>/templates")
	return cmd
}
