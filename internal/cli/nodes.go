package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newNodesCmd(g *globals) *cobra.Command {
	return listCmd(g, &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes",
		Long: `List the hosts that run sandboxes, with their state (ready, draining, or
lost when a node stopped reporting), capacity, usage, sandbox count and
the sandboxes its warm pool holds prestarted (counted in COMMITTED).`,
	}, (*client.Client).Nodes, "ID\tSTATE\tSANDBOXES\tPOOLED\tCPUS\tMEMORY\tCOMMITTED\tUSED\tRUNTIME", func(n client.Node) string {
		return fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%dMiB\t%dMiB\t%dMiB\t%s %s", n.ID, n.State, n.Sandboxes, n.Pooled,
			n.Capacity.CPUCount, n.Capacity.MemoryMB, n.Usage.CommittedMemoryMB, n.Usage.MemoryMB, n.Runtime, n.RuntimeVersion)
	})
}

func newNodeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a node agent that joins a cluster (and operate on nodes)",
		Args:  cobra.NoArgs,
	}
	// Running the agent is the host's (Linux only); operating on nodes
	// is any client's.
	nodeAgent(cmd)

	var undo, migrate bool
	drain := &cobra.Command{
		Use:   "drain ID",
		Short: "Stop placing sandboxes on a node",
		Long: `Mark node ID draining: it takes no new sandboxes (creates, resumes and
forks answer 503 while no other node can take them), and its running
sandboxes keep running. --migrate then moves each of them to another node
(live: same id, processes and files; see 'aenv migrate'). --undo makes it
ready again.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx, out := cmd.Context(), cmd.OutOrStdout()
			n, err := c.Drain(ctx, args[0], !undo)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "node %s is %s (%d sandboxes running)\n", n.ID, n.State, n.Sandboxes)
			if !migrate || undo {
				return nil
			}
			sbs, err := c.ListWith(ctx, client.ListOptions{States: []string{"running"}})
			if err != nil {
				return err
			}
			failed := 0
			for _, sb := range sbs {
				if sb.NodeID != n.ID {
					continue
				}
				m, err := c.Migrate(ctx, sb.SandboxID, "")
				if err != nil {
					failed++
					fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", sb.SandboxID, err)
					continue
				}
				fmt.Fprintf(out, "%s -> %s (down %d ms)\n", sb.SandboxID, m.NodeID, m.DowntimeMs)
			}
			if failed > 0 {
				return fmt.Errorf("%d sandboxes could not be moved off node %s", failed, n.ID)
			}
			return nil
		},
	}
	drain.Flags().BoolVar(&undo, "undo", false, "make the node ready again")
	drain.Flags().BoolVar(&migrate, "migrate", false, "move the node's running sandboxes to other nodes")
	cmd.AddCommand(drain, newNodeRmCmd(g))
	return cmd
}

func newMigrateCmd(g *globals) *cobra.Command {
	var nodeID string
	cmd := &cobra.Command{
		Use:   "migrate ID",
		Short: "Move a running sandbox to another node",
		Long: `Move running sandbox ID to another node (--node, or the one the scheduler
picks): its memory, processes and files are saved, restored there under
the same id and URL, and its deadline is kept. Streams open during the
move end with an error the SDKs' callers retry; the sandbox's own
outbound connections are reset. Needs a snapshot store the nodes share
(--store). Prints where it went and how long it did not run.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			m, err := c.Migrate(cmd.Context(), args[0], nodeID)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s moved from %s to %s (down %d ms)\n", m.SandboxID, m.FromNodeID, m.NodeID, m.DowntimeMs)
			return nil
		},
	}
	cmd.Flags().StringVar(&nodeID, "node", "", "node to move to (default: the scheduler's pick)")
	return cmd
}
