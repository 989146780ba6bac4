package cli

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/template"
)

func newTemplateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Manage templates",
	}
	var mirror string
	build := &cobra.Command{
		Use:   "build-base DIR",
		Short: "Build the base template's root filesystem into DIR",
		Long: `Build the base template's root filesystem (Debian bookworm with bash,
coreutils and python3, plus the unprivileged 'user') into DIR with
debootstrap, from this host's Debian mirror. Point a server at it with
--base-rootfs DIR; a server builds it itself on first start otherwise.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return template.BuildBase(cmd.Context(), args[0], template.BuildOptions{Mirror: mirror, Log: os.Stderr})
		},
	}
	build.Flags().StringVar(&mirror, "mirror", "", "Debian mirror (default: the first in this host's apt sources)")
	cmd.AddCommand(build)
	return cmd
}
