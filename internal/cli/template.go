package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newTemplateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "template",
		Short: "Manage templates",
		Long:  "List, remove and build the templates sandboxes are created from.",
		Args:  cobra.ArbitraryArgs,
		RunE:  groupRun,
	}
	cmd.AddCommand(templateBuilders()...)
	cmd.AddCommand(newTemplateListCmd(g), newTemplateRemoveCmd(g), newTemplatePublishCmd(g))
	return cmd
}

func newTemplateListCmd(g *globals) *cobra.Command {
	cmd := listCmd(g, &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List templates",
		Long: `List the templates the key sees: its team's, public ones and the builtins
(an admin key's: every team's). SIZE is the template's files; IMAGE its block
image (what nodes read on demand), and UNIQUE the part of that image no other
template's image shares in the store: what deleting the template frees. The
last line sums the images, and what the store keeps of them, shared chunks
once.`},
		(*client.Client).ListTemplates, "ID\tALIASES\tTEAM\tPUBLIC\tCPU\tMEMORY\tDISK\tSIZE\tIMAGE\tUNIQUE\tCREATED",
		func(t client.Template) string {
			aliases := strings.Join(t.Aliases, ",")
			if aliases == "" {
				aliases = "-"
			}
			created := "-"
			if !t.CreatedAt.IsZero() {
				created = t.CreatedAt.Local().Format(time.DateTime)
			}
			image, unique := "-", "-"
			if t.ImageBytes > 0 {
				image, unique = formatBytes(t.ImageBytes), formatBytes(t.UniqueBytes)
			}
			team := t.Team
			if team == "" {
				team = "-"
			}
			return fmt.Sprintf("%s\t%s\t%s\t%v\t%d\t%dMiB\t%dMiB\t%s\t%s\t%s\t%s", t.TemplateID, aliases, team, t.Public, t.CPUCount, t.MemoryMB, t.DiskSizeMB,
				formatBytes(t.SizeBytes), image, unique, created)
		})
	list := cmd.RunE
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := list(cmd, args); err != nil {
			return err
		}
		if out, _ := cmd.Flags().GetString("output"); out == "json" {
			return nil
		}
		c, err := g.client()
		if err != nil {
			return err
		}
		// Older servers have no usage: the table stands alone.
		if u, err := c.TemplateUsage(cmd.Context()); err == nil && u.ImageBytes > 0 {
			fmt.Fprintf(cmd.OutOrStdout(), "block images: %s; in the store, deduplicated: %s\n", formatBytes(u.ImageBytes), formatBytes(u.StoredBytes))
		}
		return nil
	}
	return cmd
}

func newTemplateRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a template",
		Long:  "Remove template NAME (its id) from the server. The server refuses while sandboxes or snapshots still use it.",
		Args:  needArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.DeleteTemplate(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), args[0])
			return nil
		},
	}
}
