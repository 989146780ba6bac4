package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/template"
)

// templateBuilders build template root filesystems from this host's
// Debian mirror (debootstrap: Linux only).
func templateBuilders() []*cobra.Command {
	var mirror string
	build := &cobra.Command{
		Use:   "build-base DIR",
		Short: "Build the base template's root filesystem into DIR",
		Long: `Build the base template's root filesystem (Debian bookworm with bash,
coreutils and python3, plus the unprivileged 'user') into DIR with
debootstrap, from this host's Debian mirror. Point a server at it with
--base-rootfs DIR; a server builds it itself on first start otherwise.`,
		Args: needArgs("DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return template.BuildBase(cmd.Context(), args[0], template.BuildOptions{Mirror: mirror, Log: os.Stderr})
		},
	}
	build.Flags().StringVar(&mirror, "mirror", "", "Debian mirror (default: the first in this host's apt sources)")
	ci := &cobra.Command{
		Use:   "build-code-interpreter DIR",
		Short: "Build the code-interpreter template's root filesystem into DIR",
		Long: `Build the root filesystem of the code-interpreter template (the default of
the @e2b/code-interpreter SDK) into DIR: the base template plus a Jupyter
kernel, numpy, pandas, matplotlib and scipy, all from this host's Debian
mirror (about 1 GB; several minutes). Serve it with
aenv server --code-interpreter-rootfs DIR; the service on port 49999 is the
aenv-interpreter binary next to envd, not part of DIR.`,
		Args: needArgs("DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return template.BuildCodeInterpreter(cmd.Context(), args[0], template.BuildOptions{Mirror: mirror, Log: os.Stderr})
		},
	}
	ci.Flags().StringVar(&mirror, "mirror", "", "Debian mirror (default: the first in this host's apt sources)")
	return []*cobra.Command{build, ci}
}
