package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/membership"
)

// nodeAgent makes cmd run this host's node agent (agent.Start).
func nodeAgent(cmd *cobra.Command) {
	var cfg agent.Config
	var logLevel, onStop, tokenFile string
	var cleanup bool
	var hs hostStrings
	cmd.Long = `Run a node agent: this host runs sandboxes for the cluster's API servers.

  aenv node --join https://SERVER:8443 --token TOKEN --ca-hash sha256:... --advertise HOST:8100

'aenv cluster join-command' on a server prints that line. The node checks
the server's certificate against --ca-hash before it sends anything, then
trades the join token (short-lived; also $AENV_JOIN_TOKEN) for a
certificate of the cluster's CA naming its id, kept with its key in
<data-dir>/secrets (node.crt, node.key). It serves its API and the sandbox
traffic over mutual TLS with it, to the cluster's servers only, and renews
it before it expires; a restart renews it without a token.

The old join, --join http://SERVER:8000 --token CLUSTERTOKEN, still works
and is insecure: the cluster token (<data-dir>/secrets/cluster-token on the
first server; also $AENV_CLUSTER_TOKEN) and the data key cross the network
in the clear, and the node serves plain HTTP. Either way the server hands
over the cluster's etcd endpoints (it must reach its etcd over the
network: --etcd-endpoints, or --etcd-listen for its embedded member);
--etcd-endpoints names them directly. Servers reach the node's API and
its sandboxes at --advertise. Over https, the node reaches etcd with its
certificate, which etcd lets write only this node's registration; plain
http off loopback is refused unless --insecure-cluster.

The node registers its capacity and usage under a 10 s lease. Stopping it
(even kill -9) leaves its sandboxes running: restarted within the lease it
takes them over; later, the cluster has reported them lost and the node
removes them. --on-stop=drain has the cluster move them to other nodes on
SIGTERM first. Needs root.

With an https --join, a --token-file that does not exist (any more) is no
error once the node holds a certificate from an earlier join: it renews
that one, so the token's file may go after the first start (as
scripts/install.sh --node removes it). --cleanup kills what a stopped
node with the same settings left running, for uninstalling.`
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := hostSettings(&cfg, hs, logLevel); err != nil {
			return err
		}
		if cmd.Flags().Changed("token") && !strings.HasPrefix(cfg.Join, "https://") {
			return &usageError{cmd: cmd, err: errors.New("--token without an https --join would be the cluster token, a long-lived secret, on the command line, where every user of this host can read it (ps): use --token-file FILE or $AENV_CLUSTER_TOKEN, or join over https with a join token ('aenv cluster join-command' prints the command)")}
		}
		if cleanup {
			// Before the token: a node being removed needs none.
			if err := agent.Cleanup(cmd.Context(), cfg); err != nil {
				return err
			}
			cfg.Logger.Info("removed the sandboxes and network slots a stopped node left", "run_dir", cfg.RunDir)
			return nil
		}
		if tokenFile != "" {
			var err error
			if cfg.ClusterToken, err = readSecretFile("--token-file", tokenFile); err != nil {
				if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(cfg.Join, "https://") || !exists(agent.NodeFiles(cfg.DataDir).CertPath()) {
					return err
				}
				// A join token is needed once: the node renews the
				// certificate it was given with the one it holds.
				cfg.ClusterToken = ""
				cfg.Logger.Info("the join token's file is gone; renewing this node's certificate instead", "token_file", tokenFile)
			}
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
	f.StringVar(&cfg.ClusterToken, "token", "", "with an https --join: the join token, short-lived and single-purpose (default: --token-file, else $AENV_JOIN_TOKEN)")
	f.StringVar(&tokenFile, "token-file", "", "file holding the join token (https --join) or the cluster token (the old http join, or --etcd-endpoints; default: $AENV_CLUSTER_TOKEN, else <data-dir>/secrets/cluster-token)")
	f.StringVar(&cfg.CAHash, "ca-hash", "", "the cluster CA's hash (sha256:...) the server of an https --join must prove it holds")
	f.StringVar(&cfg.NodeID, "node-id", "", "this node's id (default: the hostname)")
	f.BoolVar(&cleanup, "cleanup", false, "do not run: kill every sandbox a stopped node with these settings left running, remove its network slots, and exit (for uninstalling)")
	f.StringVar(&onStop, "on-stop", "keep", "what stopping the node does with running sandboxes: keep (a restart takes them over), drain (the cluster moves them to other nodes, live, or pauses them into the store; for a host going away) or kill")
}

// exists reports whether path names a file of any kind.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
