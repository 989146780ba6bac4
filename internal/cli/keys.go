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
	var maxSandboxes int
	var admin bool
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an API key and print it (it is shown only this once)",
		Args:  needArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), args[0], maxSandboxes, admin)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			fmt.Fprintf(cmd.ErrOrStderr(), "created key %s (%s); store it now: it is not shown again\n", k.ID, k.Name)
			return nil
		},
	}
	create.Flags().IntVar(&maxSandboxes, "max-sandboxes", 0, "running sandboxes the key may have at once (0: no bound); past it creates get 429")
	create.Flags().BoolVar(&admin, "admin", false, "let the key manage keys and drain nodes")

	ls := listCmd(g, &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List API keys"},
		(*client.Client).Keys, "ID\tNAME\tKEY\tADMIN\tMAX SANDBOXES\tCREATED", func(k client.Key) string {
			limit := "-"
			if k.MaxSandboxes > 0 {
				limit = strconv.Itoa(k.MaxSandboxes)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%v\t%s\t%s", k.ID, k.Name, k.Hint, k.Admin, limit, k.CreatedAt.Local().Format("2006-01-02 15:04:05"))
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
