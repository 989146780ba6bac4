package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/pki"
)

func newClusterCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Manage the cluster: how hosts join it, its CA, servers and etcd members",
		Long: `Manage the cluster: join tokens, short-lived and revocable, that a node
trades (once it has checked the server's certificate against the CA hash)
for a certificate of the cluster's CA; the CA itself; the API servers
running; and the members of its etcd. These commands need an admin key,
such as a server's own (<data-dir>/secrets/api-key).`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	var ttl time.Duration
	var description string
	var asServer bool
	join := &cobra.Command{
		Use:   "join-command",
		Short: "Make a join token and print the command that joins a node (or a server) with it",
		Long: `Make a join token (valid for --ttl) and print the whole command that joins a
node with it:

  aenv node --join https://SERVER:8443 --token TOKEN --ca-hash sha256:...

The server is the one this command talks to, at its cluster listener
(--cluster-listen, --cluster-advertise). Anyone holding the token may join
a node until it expires or is revoked ('aenv cluster tokens revoke ID').

With --server the token joins another API server instead:

  aenv server --join https://SERVER:8443 --token TOKEN --ca-hash sha256:...

A joining server is handed what every server holds, over TLS checked
against the CA hash: the cluster's etcd endpoints, the data key, the
cluster token and the CA with its key (every server signs certificates).
Keep such a token as you would the CA's key. A node's token joins no
server, and a server's token no node.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			create := c.CreateJoinToken
			if asServer {
				create = c.CreateServerJoinToken
			}
			jc, err := create(cmd.Context(), ttl, description)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), jc.Command)
			fmt.Fprintf(cmd.ErrOrStderr(), "join token %s expires at %s\n", jc.ID, jc.ExpiresAt.Local().Format("2006-01-02 15:04:05"))
			return nil
		},
	}
	join.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the join token is valid (at most 168h)")
	join.Flags().StringVar(&description, "description", "", "what the token is for, shown by 'aenv cluster tokens ls'")
	join.Flags().BoolVar(&asServer, "server", false, "make a token that joins one API server ('aenv server --join'), handed the CA's key and the data key, instead of nodes")

	tokens := &cobra.Command{Use: "tokens", Short: "List or revoke join tokens", Args: cobra.ArbitraryArgs, RunE: groupRun}
	ls := listCmd(g, &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List the join tokens not yet expired"},
		(*client.Client).JoinTokens, "ID\tROLE\tEXPIRES\tCREATED\tDESCRIPTION", func(t client.JoinToken) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", t.ID, t.Role, t.ExpiresAt.Local().Format("2006-01-02 15:04:05"),
				t.CreatedAt.Local().Format("2006-01-02 15:04:05"), t.Description)
		})
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke a join token: no node joins with it any more",
		Args:  needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.RevokeJoinToken(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", args[0])
			return nil
		},
	}
	tokens.AddCommand(ls, revoke)
	servers := listCmd(g, &cobra.Command{Use: "servers", Short: "List the API servers running now"},
		(*client.Client).Servers, "NAME\tADDRESSES", func(s client.Server) string {
			return fmt.Sprintf("%s\t%s", s.Name, strings.Join(s.Addresses, ","))
		})
	cmd.AddCommand(join, tokens, servers, newClusterCACmd(), newClusterEtcdCmd(g))
	return cmd
}

// newClusterEtcdCmd lists and removes the members of the cluster's etcd.
func newClusterEtcdCmd(g *globals) *cobra.Command {
	cmd := listCmd(g, &cobra.Command{
		Use:   "etcd",
		Short: "List the members of the cluster's etcd, and its leader",
		Long: `List the members of the cluster's etcd: the servers' embedded members
(--etcd-peer-listen; a server joins with one of its own) or an external
cluster's. A member added by a join shows as a learner until it has caught
up and is promoted, and as not started until it first runs.

'aenv cluster etcd remove NAME' removes a member whose server is gone for
good: while it is a member it counts against the quorum (of three, two must
run). Its server cannot start on its data again; it joins afresh.`,
	}, (*client.Client).EtcdMembers, "NAME\tID\tSTATE\tLEADER\tPEER URLS\tCLIENT URLS", func(m client.EtcdMember) string {
		st := "voter"
		switch {
		case !m.Started:
			st = "not started"
		case m.Learner:
			st = "learner"
		}
		leader := ""
		if m.Leader {
			leader = "*"
		}
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", m.Name, m.ID, st, leader, strings.Join(m.PeerURLs, ","), strings.Join(m.ClientURLs, ","))
	})
	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Remove a member (by name or hex id) of the cluster's etcd whose server is gone for good",
		Args:  needArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.RemoveEtcdMember(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed etcd member %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(remove)
	return cmd
}

// newClusterCACmd prints the cluster CA's certificate from a server's data
// directory, for the clients of an API that serves a certificate of it.
func newClusterCACmd() *cobra.Command {
	var dataDir, caDir string
	var hash, create bool
	cmd := &cobra.Command{
		Use:   "ca",
		Short: "Print the cluster's CA certificate, which clients check the API's certificate against",
		Long: `Print the certificate (PEM) of the cluster's CA from a server's data directory
(<data-dir>/secrets/ca.crt). A server listening beyond loopback without
--tls-cert serves a certificate of this CA; clients trust it with:

  aenv cluster ca > aenv-ca.crt
  aenv auth --url https://HOST:8000 --ca-file aenv-ca.crt   # this CLI
  NODE_EXTRA_CA_CERTS=aenv-ca.crt node agent.mjs            # the E2B JS SDK
  SSL_CERT_FILE=aenv-ca.crt python3 agent.py                # the E2B Python SDK

The certificate is public; the CA's key (ca.key beside it) is not printed.
--hash prints its hash instead, the --ca-hash of a join command.

--init makes the CA in --ca-dir first, unless it holds one: for a cluster
whose etcd members (aenv etcd --ca-dir) and first server start at once,
each given a copy of ca.crt and ca.key, which would otherwise each make
their own.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := caDir
			if dir == "" {
				dir = filepath.Join(dataDir, "secrets")
			}
			if create {
				if err := initCA(pki.Files{Dir: dir}); err != nil {
					return err
				}
			}
			path := pki.Files{Dir: dir}.CAPath()
			b, err := os.ReadFile(path)
			if err != nil {
				return fmt.Errorf("reading the cluster's CA: %w (is --data-dir a server's data directory?)", err)
			}
			cert, err := pki.ParseCertificate(b)
			if err != nil {
				return fmt.Errorf("reading the cluster's CA %s: %w", path, err)
			}
			if hash {
				_, err = fmt.Fprintln(cmd.OutOrStdout(), pki.Hash(cert))
				return err
			}
			_, err = cmd.OutOrStdout().Write(b)
			return err
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", defaultDataDir, "the server's data directory")
	cmd.Flags().BoolVar(&hash, "hash", false, "print the CA's hash (sha256:...) instead of its certificate")
	cmd.Flags().StringVar(&caDir, "ca-dir", "", "the directory of the CA's ca.crt and ca.key (default: <data-dir>/secrets)")
	cmd.Flags().BoolVar(&create, "init", false, "make the CA (ca.crt, ca.key, mode 0600) in --ca-dir if it holds none")
	return cmd
}

func newNodeRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID",
		Short: "Remove a node from the cluster: its certificate is refused from then on",
		Long: `Remove node ID from the cluster: every server refuses its certificate from
then on, and it is not renewed; its registration is dropped. Its sandboxes
are reported lost. A host joins again only with a new join token.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.RemoveNode(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed node %s\n", args[0])
			return nil
		},
	}
}

// initCA makes a CA in files unless they hold one (both files, or
// neither: one alone is an error). It is pki's alone, as this CLI links
// nothing of the state on a laptop; a server's membership.BootstrapCA
// makes the same files.
func initCA(files pki.Files) error {
	_, errC := os.Stat(files.CAPath())
	_, errK := os.Stat(files.CAKeyPath())
	switch {
	case errC == nil && errK == nil:
		return nil
	case !errors.Is(errC, os.ErrNotExist) || !errors.Is(errK, os.ErrNotExist):
		return fmt.Errorf("making the cluster's CA in %s: one of ca.crt and ca.key is there without the other (%v, %v)", files.Dir, errC, errK)
	}
	ca, err := pki.NewCA(time.Now())
	if err != nil {
		return fmt.Errorf("making the cluster's CA in %s: %w", files.Dir, err)
	}
	if err := pki.WriteSecret(files.CAKeyPath(), ca.KeyPEM()); err != nil {
		return fmt.Errorf("making the cluster's CA in %s: %w", files.Dir, err)
	}
	if err := pki.WriteSecret(files.CAPath(), ca.CertPEM()); err != nil {
		return fmt.Errorf("making the cluster's CA in %s: %w", files.Dir, err)
	}
	return nil
}
