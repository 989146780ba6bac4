package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/membership"
)

// nodeAgent makes cmd run this host's node agent (agent.Start).
func nodeAgent(cmd *cobra.Command) {
	var cfg agent.Config
	var logLevel, onStop string
	var hs hostStrings
	cmd.Long = `Run a node agent: this host runs sandboxes for the cluster's API servers.

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
SIGTERM first. Needs root.`
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
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
	}
	f := cmd.Flags()
	hostFlags(f, &cfg, &hs, &logLevel)
	f.StringVar(&cfg.Listen, "listen", agent.DefaultListen, "address of the node API and the sandbox traffic servers forward")
	f.StringVar(&cfg.Advertise, "advertise", "", "host:port servers reach this node at (default: --listen, if it names an address)")
	f.StringVar(&cfg.Join, "join", "", "URL of a server of the cluster to learn its etcd endpoints from")
	f.StringVar(&cfg.ClusterToken, "token", "", "the cluster token (default: $AENV_CLUSTER_TOKEN, else <data-dir>/secrets/cluster-token)")
	f.StringVar(&cfg.NodeID, "node-id", "", "this node's id (default: the hostname)")
	f.StringVar(&onStop, "on-stop", "keep", "what stopping the node does with running sandboxes: keep (a restart takes them over), drain (the cluster moves them to other nodes, live, or pauses them into the store; for a host going away) or kill")
}
