package cli

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/state"
)

func newStateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "state",
		Short: "Back up and restore the server's live state (etcd)",
		Long: `Back up and restore the live state of an aenv server: its sandbox
records and deadlines, kept in etcd (by default an embedded member in
<data-dir>/etcd, reached through <run-dir>/etcd.sock).

Templates and snapshots are not part of it: they live in the data directory
or the snapshot store.`,
	}
	cmd.AddCommand(newStateBackupCmd(), newStateRestoreCmd(), newStateRotateDataKeyCmd())
	return cmd
}

func newStateBackupCmd() *cobra.Command {
	var dataDir, runDir string
	var endpoints []string
	cmd := &cobra.Command{
		Use:   "backup FILE",
		Short: "Write a consistent snapshot of the live state to FILE",
		Long: `Write a consistent snapshot of the live state to FILE, while the server runs
(through its etcd) or, when it is stopped, from its data directory.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			st, done, err := openServerState(ctx, dataDir, runDir, endpoints)
			if err != nil {
				return fmt.Errorf("backing up: %w", err)
			}
			defer done()
			tmp := args[0] + ".partial"
			f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
			if err != nil {
				return fmt.Errorf("backing up: %w", err)
			}
			if err := st.Backup(ctx, f); err != nil {
				f.Close()
				os.Remove(tmp)
				return fmt.Errorf("backing up: %w", err)
			}
			if err := f.Sync(); err != nil {
				f.Close()
				os.Remove(tmp)
				return fmt.Errorf("backing up: %w", err)
			}
			f.Close()
			if err := os.Rename(tmp, args[0]); err != nil {
				return fmt.Errorf("backing up: %w", err)
			}
			fi, _ := os.Stat(args[0])
			fmt.Fprintf(cmd.OutOrStdout(), "state backed up to %s (%d bytes)\n", args[0], fi.Size())
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", defaultDataDir, "the server's data directory")
	cmd.Flags().StringVar(&runDir, "run-dir", "/run/aenv", "the server's run directory (where its etcd socket is)")
	cmd.Flags().StringSliceVar(&endpoints, "etcd-endpoints", nil, "back up this external etcd cluster instead")
	return cmd
}

// openServerState reaches a server's etcd: the external cluster at
// endpoints, else the running server's through its socket in runDir,
// else (no server) its data directory's, opened here. done closes it.
func openServerState(ctx context.Context, dataDir, runDir string, endpoints []string) (*state.Etcd, func(), error) {
	cfg := state.Config{Endpoints: endpoints, Logger: quietLogger()}
	cleanup := func() {}
	if slices.ContainsFunc(endpoints, func(e string) bool { return strings.HasPrefix(e, "https://") }) {
		// The cluster's etcd over TLS: reached as the servers are, with
		// a certificate this host's CA files issue (a server's host).
		ca, err := membership.ReadCAFiles(membership.CAFiles(dataDir))
		if err == nil && ca == nil {
			err = fmt.Errorf("no cluster CA in %s", membership.SecretsDir(dataDir))
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reaching etcd over TLS: %w", err)
		}
		etls, err := membership.OpenEtcdTLS(membership.EtcdTLSConfig{CA: ca, Client: true, Lifetime: time.Hour, Logger: quietLogger()})
		if err != nil {
			return nil, nil, err
		}
		cfg.ClientTLS, cleanup = etls.ClientTLS(), etls.Close
	}
	if len(endpoints) == 0 {
		sock := filepath.Join(runDir, state.SocketName)
		if _, err := os.Stat(sock); err == nil {
			cfg.Endpoints = []string{"unix://" + sock}
		} else {
			// No server: open its data directory ourselves.
			tmp, err := os.MkdirTemp("", "aenv-state-")
			if err != nil {
				return nil, nil, err
			}
			cleanup = func() { os.RemoveAll(tmp) }
			cfg.DataDir, cfg.SocketDir = filepath.Join(dataDir, "etcd"), tmp
			if _, err := os.Stat(cfg.DataDir); err != nil {
				cleanup()
				return nil, nil, fmt.Errorf("no running server (%s) and no state in %s", sock, cfg.DataDir)
			}
		}
	}
	st, err := state.Open(ctx, cfg)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	done := func() { st.Close(); cleanup() }
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := st.WaitReady(wctx); err != nil {
		done()
		return nil, nil, err
	}
	return st, done, nil
}

func newStateRestoreCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the embedded live state with a backup (server stopped)",
		Long: `Replace the embedded etcd's data in <data-dir>/etcd with the backup in FILE.
Stop the server first; the current data is moved aside to
<data-dir>/etcd.old-<time>, not deleted. On its next start the server
reconciles the restored records with the sandboxes that really run.
For an external etcd cluster use etcdutl instead.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := filepath.Join(dataDir, "etcd")
			if err := state.RestoreEmbedded(cmd.Context(), args[0], dir); err != nil {
				return fmt.Errorf("restoring: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "state restored into %s from %s\n", dir, args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", defaultDataDir, "the server's data directory")
	return cmd
}

// newEtcdCmd runs a standalone etcd member from the embedded server code,
// for an external state cluster (several hosts) and for tests that need
// one as a separate process.
func newEtcdCmd() *cobra.Command {
	var mc state.MemberConfig
	var clientURLs, peerURLs string
	var logLevel, caDir, advClient, advPeer string
	cmd := &cobra.Command{
		Use:   "etcd",
		Short: "Run an etcd member for an external state cluster",
		Long: `Run one etcd member, with the same compaction and quota settings as the
embedded one, until SIGTERM. Point servers at a cluster of them with
'aenv server --etcd-endpoints'. Any etcd v3 cluster works as well.

With --ca-dir DIR (ca.crt and ca.key of the cluster's CA: a server's
<data-dir>/secrets, or made there at the first member's start), https URLs
are served with a certificate of that CA, renewed in place, and clients and
peers must present one: servers reach such members at https
--etcd-endpoints with certificates of their own CA, turn etcd's auth on and
let each node that joins over TLS write only its own registration. Copy the
CA to every member's --ca-dir and every server's <data-dir>/secrets before
starting them. Plain http is for loopback only, unless --insecure-cluster.

A member reached by a name that outlives its address (a StatefulSet's pod)
listens on every address and advertises the name: --listen-client
https://0.0.0.0:2379 --advertise-client https://NAME:2379, the same for
peers, with --initial-cluster naming the peers by name.

Example, one member:
  aenv etcd --name s1 --data-dir /var/lib/aenv-etcd --ca-dir /var/lib/aenv/secrets \
    --listen-client https://10.0.0.5:2379 --listen-peer https://10.0.0.5:2380 --new`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			mc.ClientURLs = strings.Split(clientURLs, ",")
			mc.PeerURLs = strings.Split(peerURLs, ",")
			if advClient != "" {
				mc.AdvertiseClientURLs = strings.Split(advClient, ",")
			}
			if advPeer != "" {
				mc.AdvertisePeerURLs = strings.Split(advPeer, ",")
			}
			if mc.Insecure {
				log.Warn("--insecure-cluster: this member may serve plain http off loopback, where anyone on the network reads and writes the cluster's state")
			}
			if caDir != "" {
				etls, err := etcdMemberTLS(caDir, mc, log)
				if err != nil {
					return err
				}
				defer etls.Close()
				mc.TLS, mc.PeerTLS = etls.MemberTLS(), etls.MemberTLS()
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			log.Info("etcd member starting", "name", mc.Name, "client", clientURLs, "peer", peerURLs)
			return state.RunMember(ctx, mc, log)
		},
	}
	f := cmd.Flags()
	f.StringVar(&mc.Name, "name", "default", "member name, unique in the cluster")
	f.StringVar(&mc.DataDir, "data-dir", "", "the member's data directory (required)")
	f.StringVar(&clientURLs, "listen-client", "", "client URLs to listen on and advertise (comma-separated, required)")
	f.StringVar(&peerURLs, "listen-peer", "", "peer URLs to listen on and advertise (comma-separated, required)")
	f.StringVar(&advClient, "advertise-client", "", "client URLs to advertise instead of --listen-client's (comma-separated): a name clients reach when the member listens on every address or on an address that changes (a pod's)")
	f.StringVar(&advPeer, "advertise-peer", "", "peer URLs to advertise instead of --listen-peer's (comma-separated; they must be the ones --initial-cluster names)")
	f.StringVar(&mc.InitialCluster, "initial-cluster", "", "name=peerURL,... of every member (default: this member alone)")
	f.BoolVar(&mc.NewCluster, "new", false, "bootstrap a new cluster (first start of every member)")
	f.StringVar(&caDir, "ca-dir", "", "directory of the cluster CA's ca.crt and ca.key (made there if missing): serve https URLs with a certificate of it, to clients and peers with one")
	f.BoolVar(&mc.Insecure, "insecure-cluster", false, "allow plain http URLs off loopback: the cluster's state in the clear on the network")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	for _, name := range []string{"data-dir", "listen-client", "listen-peer"} {
		cmd.MarkFlagRequired(name)
	}
	return cmd
}

// etcdMemberTLS issues a member its certificate from the CA in caDir
// (made there if missing), for its client and peer URLs, and renews it.
func etcdMemberTLS(caDir string, mc state.MemberConfig, log *slog.Logger) (*membership.EtcdTLS, error) {
	files := pki.Files{Dir: caDir}
	ca, err := membership.BootstrapCA(files, true, log)
	if err != nil {
		return nil, err
	}
	hosts := state.URLHosts(slices.Concat(mc.ClientURLs, mc.PeerURLs, mc.AdvertiseClientURLs, mc.AdvertisePeerURLs))
	mf := membership.EtcdMemberFiles(caDir)
	return membership.OpenEtcdTLS(membership.EtcdTLSConfig{CA: ca, Member: &mf, MemberName: mc.Name, MemberHosts: hosts, Logger: log})
}

// quietLogger logs only errors, for commands whose output is the result.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}
