package cli

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/envd"
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the aenv version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			v := "(devel)"
			if bi, ok := debug.ReadBuildInfo(); ok {
				for _, s := range bi.Settings {
					if s.Key == "vcs.revision" {
						v = s.Value
					}
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "aenv %s (envd protocol %s)\n", v, envd.Version)
		},
	}
}
