package cli

import (
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newTeamsCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "teams",
		Short: "Manage teams and their quotas",
		Long: `Every API key belongs to a team, and everything a key makes (sandboxes,
templates, snapshots, volumes, builds) belongs to its team: other teams'
keys neither see nor touch it. Admin keys act across teams. 'teams ls'
shows each team's quota and usage (a non-admin key sees its own team);
'create' and 'set' need an admin key.`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRun,
	}
	quota := func(c *cobra.Command) {
		f := c.Flags()
		f.Int("max-sandboxes", 0, "running sandboxes at once (creates, forks and resumes count; 0: no bound)")
		f.Int("max-paused", 0, "paused sandboxes kept (0: no bound)")
		f.Int("max-builds", 0, "template builds at once; more wait (0: no bound)")
		f.Int64("max-volume-bytes", 0, "bytes of volumes in all (0: no bound)")
		f.Int64("max-snapshot-bytes", 0, "bytes of snapshots in all (0: no bound)")
	}
	// read takes the flags given (only those: set changes only what it
	// names).
	read := func(c *cobra.Command) client.TeamQuota {
		var q client.TeamQuota
		f := c.Flags()
		ints := map[string]**int{"max-sandboxes": &q.MaxSandboxes, "max-paused": &q.MaxPaused, "max-builds": &q.MaxBuilds}
		for name, dst := range ints {
			if f.Changed(name) {
				v, _ := f.GetInt(name)
				*dst = &v
			}
		}
		int64s := map[string]**int64{"max-volume-bytes": &q.MaxVolumeBytes, "max-snapshot-bytes": &q.MaxSnapshotBytes}
		for name, dst := range int64s {
			if f.Changed(name) {
				v, _ := f.GetInt64(name)
				*dst = &v
			}
		}
		return q
	}
	create := &cobra.Command{
		Use:   "create ID",
		Short: "Create a team (keys join it with 'aenv keys create NAME --team ID')",
		Args:  needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTeam(cmd.Context(), args[0], read(cmd))
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.ID)
			return nil
		},
	}
	quota(create)
	set := &cobra.Command{
		Use:   "set ID",
		Short: "Change a team's quota (only the flags given change)",
		Args:  needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.SetTeam(cmd.Context(), args[0], read(cmd))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: sandboxes %s, paused %s, builds %s, volume bytes %s, snapshot bytes %s\n", t.ID,
				bound(int64(t.MaxSandboxes)), bound(int64(t.MaxPaused)), bound(int64(t.MaxBuilds)), bound(t.MaxVolumeBytes), bound(t.MaxSnapshotBytes))
			return nil
		},
	}
	quota(set)
	ls := listCmd(g, &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List teams with their usage against their quotas"},
		(*client.Client).Teams, "ID\tKEYS\tRUNNING\tPAUSED\tBUILDS\tVOLUMES\tVOLUME BYTES\tSNAPSHOT BYTES\tCREATED", func(t client.Team) string {
			return fmt.Sprintf("%s\t%d\t%d/%s\t%d/%s\t-/%s\t%d\t%d/%s\t%d/%s\t%s", t.ID, t.Usage.Keys,
				t.Usage.Running, bound(int64(t.MaxSandboxes)), t.Usage.Paused, bound(int64(t.MaxPaused)), bound(int64(t.MaxBuilds)),
				t.Usage.Volumes, t.Usage.VolumeBytes, bound(t.MaxVolumeBytes), t.Usage.SnapshotBytes, bound(t.MaxSnapshotBytes),
				t.CreatedAt.Local().Format("2006-01-02 15:04:05"))
		})
	cmd.AddCommand(create, set, ls)
	return cmd
}

// bound prints a quota: "-" for none.
func bound(n int64) string {
	if n <= 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

func newTemplatePublishCmd(g *globals) *cobra.Command {
	var private bool
	cmd := &cobra.Command{
		Use:   "publish NAME",
		Short: "Make a template visible to every team (read-only), or private again with --private",
		Long: `Make template NAME (its id, or its name in the admin key's team) public:
every team sees it and may create sandboxes from it, and only admin keys may
change or delete it. A create looks up the team's own templates first, then
public ones by name. Needs an admin key.`,
		Args: needArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.PublishTemplate(cmd.Context(), args[0], !private); err != nil {
				return err
			}
			state := "public"
			if private {
				state = "private"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is %s\n", args[0], state)
			return nil
		},
	}
	cmd.Flags().BoolVar(&private, "private", false, "make it private to its team again")
	return cmd
}
