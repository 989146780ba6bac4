package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newNodesCmd(g *globals) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes",
		Long: `List the hosts that run sandboxes, with their state (ready, draining, or
lost when a node stopped reporting), capacity, usage and sandbox count.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			nodes, err := c.Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), nodes)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTATE\tSANDBOXES\tCPUS\tMEMORY\tCOMMITTED\tUSED\tRUNTIME")
			for _, n := range nodes {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%dMiB\t%dMiB\t%dMiB\t%s %s\n", n.ID, n.State, n.Sandboxes,
					n.Capacity.CPUCount, n.Capacity.MemoryMB, n.Usage.CommittedMemoryMB, n.Usage.MemoryMB, n.Runtime, n.RuntimeVersion)
			}
			return tw.Flush()
		},
	}
	outputFlag(cmd, &output)
	return cmd
}

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Operate on one node",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRun,
	}
	var undo bool
	drain := &cobra.Command{
		Use:   "drain ID",
		Short: "Stop placing sandboxes on a node",
		Long: `Mark node ID draining: it takes no new sandboxes (creates, resumes and
forks answer 503 while no other node can take them), and its running
sandboxes keep running. --undo makes it ready again.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			n, err := c.Drain(cmd.Context(), args[0], !undo)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "node %s is %s (%d sandboxes running)\n", n.ID, n.State, n.Sandboxes)
			return nil
		},
	}
	drain.Flags().BoolVar(&undo, "undo", false, "make the node ready again")
	cmd.AddCommand(drain)
	return cmd
}
