package cli

import (
	"fmt"
	"runtime"

	"github.com/spf13/cobra"
)

// linuxOnly makes cmd fail, whatever it is given, saying that it runs on
// Linux only.
func linuxOnly(cmd *cobra.Command) *cobra.Command {
	cmd.Short += " (Linux only)"
	cmd.Args = cobra.ArbitraryArgs
	cmd.DisableFlagParsing = true
	cmd.RunE = func(c *cobra.Command, _ []string) error {
		return fmt.Errorf("aenv %s runs on Linux only (this aenv is built for %s/%s); run it on the host, and drive it from here with the client commands", c.Name(), runtime.GOOS, runtime.GOARCH)
	}
	return cmd
}
