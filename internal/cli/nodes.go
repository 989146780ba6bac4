package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/membership"
)

func newNodesCmd(g *globals) *cobra.Command {
	return listCmd(g, &cobra.Command{
		Use:   "nodes",
		Short: "List the cluster's nodes",
		Long: `List the hosts that run sandboxes, with their state (ready, draining, or
lost when a node stopped reporting), capacity, usage and sandbox count.`,
	}, (*client.Client).Nodes, "ID\tSTATE\tSANDBOXES\tCPUS\tMEMORY\tCOMMITTED\tUSED\tRUNTIME", func(n client.Node) string {
		return fmt.Sprintf("%s\t%s\t%d\t%d\t%dMiB\t%dMiB\t%dMiB\t%s %s", n.ID, n.State, n.Sandboxes,
			n.Capacity.CPUCount, n.Capacity.MemoryMB, n.Usage.CommittedMemoryMB, n.Usage.MemoryMB, n.Runtime, n.RuntimeVersion)
	})
}

func newNodeCmd(g *globals) *cobra.Command {
	var cfg agent.Config
	var logLevel, onStop string
	var hs hostStrings
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Run a node agent that joins a cluster (and operate on nodes)",
		Long: `Run a node agent: this host runs sandboxes for the cluster's API servers.

  aenv node --join http://SERVER:8000 --token TOKEN --advertise HOST:8100

--join asks that server for the cluster's etcd endpoints (the server must
reach its etcd over the network: --etcd-endpoints, or --etcd-listen for its
embedded member); --etcd-endpoints names them directly. The token is the
cluster's (<data-dir>/secrets/cluster-token on the first server; also read
from $AENV_CLUSTER_TOKEN or this node's <data-dir>/secrets/cluster-token):
a node with the wrong one is refused, and the node refuses servers without
it. Servers reach the node's API and its sandboxes at --advertise.

The node registers its capacity and usage under a 10 s lease. Stopping it
(even kill -9) leaves its sandboxes running: restarted within the lease it
takes them over; later, the cluster has reported them lost and the node
removes them. --on-stop=drain has the cluster move them to other nodes on
SIGTERM first. Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := hostSettings(&cfg, hs, logLevel); err != nil {
				return err
			}
			stopTimeout := 30 * time.Second
			switch onStop {
			case "keep":
				cfg.OnStop = membership.StopKeep
			case "drain":
				cfg.OnStop = membership.StopPause
				// Moving every sandbox takes a while on a full node.
				stopTimeout = 10 * time.Minute
			case "kill":
				cfg.OnStop = membership.StopKill
			default:
				return fmt.Errorf("--on-stop must be keep, drain or kill, not %q", onStop)
			}
			ctx := cmd.Context()
			a, err := agent.Start(ctx, cfg)
			if err != nil {
				return err
			}
			return serveUntilDone(ctx, a.Close, stopTimeout, cfg.Logger, onStop)
		},
	}
	f := cmd.Flags()
	hostFlags(f, &cfg, &hs, &logLevel)
	f.StringVar(&cfg.Listen, "listen", agent.DefaultListen, "address of the node API and the sandbox traffic servers forward")
	f.StringVar(&cfg.Advertise, "advertise", "", "host:port servers reach this node at (default: --listen, if it names an address)")
	f.StringVar(&cfg.Join, "join", "", "URL of a server of the cluster to learn its etcd endpoints from")
	f.StringVar(&cfg.ClusterToken, "token", "", "the cluster token (default: $AENV_CLUSTER_TOKEN, else <data-dir>/secrets/cluster-token)")
	f.StringVar(&cfg.NodeID, "node-id", "", "this node's id (default: the hostname)")
	f.StringVar(&onStop, "on-stop", "keep", "what stopping the node does with running sandboxes: keep (a restart takes them over), drain (the cluster moves them to other nodes, live, or pauses them into the store; for a host going away) or kill")

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
	cmd.AddCommand(drain)
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
