package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newKeysCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Manage the cluster's API keys",
		Long: `Manage the API keys every server of the cluster accepts (they are kept,
hashed, in the cluster's etcd). These commands need an admin key, such as
a server's own (<data-dir>/secrets/api-key).`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	var opts client.KeyOptions
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an API key and print it (it is shown only this once)",
		Args:  needArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), args[0], opts)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			fmt.Fprintf(cmd.ErrOrStderr(), "created key %s (%s) of team %s; store it now: it is not shown again\n", k.ID, k.Name, k.Team)
			return nil
		},
	}
	create.Flags().StringVar(&opts.Team, "team", "", "the team the key joins (made if new); without it the key gets a team of its own")
	create.Flags().IntVar(&opts.MaxSandboxes, "max-sandboxes", 0, "running sandboxes the key may have at once (0: no bound; its team's quota holds too); past it creates get 429")
	create.Flags().BoolVar(&opts.Admin, "admin", false, "make it an operator's key: it manages keys, teams and nodes, and acts across teams")

	ls := listCmd(g, &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List API keys"},
		(*client.Client).Keys, "ID\tNAME\tTEAM\tKEY\tADMIN\tMAX SANDBOXES\tCREATED", func(k client.Key) string {
			limit := "-"
			if k.MaxSandboxes > 0 {
				limit = strconv.Itoa(k.MaxSandboxes)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%v\t%s\t%s", k.ID, k.Name, k.Team, k.Hint, k.Admin, limit, k.CreatedAt.Local().Format("2006-01-02 15:04:05"))
		})

	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an API key: no server accepts it any more",
		Args:  needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.RevokeKey(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(create, ls, revoke)
	return cmd
}
