package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newClusterCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Manage how hosts join the cluster",
		Long: `Manage how hosts join the cluster: join tokens, short-lived and revocable,
that a node trades (once it has checked the server's certificate against
the CA hash) for a certificate of the cluster's CA. These commands need an
admin key, such as a server's own (<data-dir>/secrets/api-key).`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	var ttl time.Duration
	var description string
	join := &cobra.Command{
		Use:   "join-command",
		Short: "Make a join token and print the command that joins a node with it",
		Long: `Make a join token (valid for --ttl) and print the whole command that joins a
node with it:

  aenv node --join https://SERVER:8443 --token TOKEN --ca-hash sha256:...

The server is the one this command talks to, at its cluster listener
(--cluster-listen, --cluster-advertise). Anyone holding the token may join
a node until it expires or is revoked ('aenv cluster tokens revoke ID').`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			jc, err := c.CreateJoinToken(cmd.Context(), ttl, description)
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

	tokens := &cobra.Command{Use: "tokens", Short: "List or revoke join tokens", Args: cobra.ArbitraryArgs, RunE: groupRun}
	ls := listCmd(g, &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List the join tokens not yet expired"},
		(*client.Client).JoinTokens, "ID\tEXPIRES\tCREATED\tDESCRIPTION", func(t client.JoinToken) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s", t.ID, t.ExpiresAt.Local().Format("2006-01-02 15:04:05"),
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
	cmd.AddCommand(join, tokens)
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
