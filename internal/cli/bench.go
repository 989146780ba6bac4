package cli

import "github.com/spf13/cobra"

func newBenchCmd() *cobra.Command {
	return &cobra.Command{Use: "bench", Short: "Measure sandbox latency against bare runsc", Hidden: true}
}
