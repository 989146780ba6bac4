package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newForkCmd(g *globals) *cobra.Command {
	var (
		count   int
		timeout int
		output  string
	)
	cmd := &cobra.Command{
		Use:   "fork ID",
		Short: "Start copies of a running sandbox",
		Long: `Fork sandbox ID into N independent sandboxes: each starts from its state
at this moment (processes, memory, files) and goes its own way; ID keeps
running. Prints one child id per line, or why a child did not start (the
command then fails).`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			if count < 1 {
				return &usageError{cmd: cmd, err: fmt.Errorf("-n must be at least 1")}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			results, err := c.Fork(cmd.Context(), args[0], count, time.Duration(timeout)*time.Second)
			if err != nil {
				return err
			}
			if output == "json" {
				var out []any
				for _, r := range results {
					if r.Err != nil {
						out = append(out, map[string]string{"error": r.Err.Error()})
					} else {
						out = append(out, r.Sandbox)
					}
				}
				return writeJSON(cmd.OutOrStdout(), out)
			}
			failed := 0
			for _, r := range results {
				if r.Err != nil {
					failed++
					fmt.Fprintln(cmd.ErrOrStderr(), "aenv: a child did not start:", r.Err)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), r.Sandbox.SandboxID)
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d children did not start", failed, len(results))
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&count, "count", "n", 1, "how many children")
	cmd.Flags().IntVar(&timeout, "timeout", 300, "seconds each child lives")
	outputFlag(cmd, &output)
	return cmd
}

func newSnapshotCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "snapshot ID",
		Short: "Save a running sandbox as a snapshot; ls and rm manage them",
		Long: `Save the whole state of running sandbox ID (processes, memory, files) as
a snapshot; the sandbox keeps running. A snapshot is a template: 'aenv
create SNAPSHOT' (or Sandbox.create with its id or --name) starts a sandbox
from it. Prints the snapshot's id.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			snap, err := c.Snapshot(cmd.Context(), args[0], name)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), snap.SnapshotID)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "a name the snapshot can also be used by")
	ls := listCmd(g, &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List snapshots"},
		(*client.Client).ListSnapshots, "ID\tNAMES\tSANDBOX\tTEMPLATE\tSIZE\tCREATED",
		func(s client.Snapshot) string {
			names := strings.Join(s.Names, ",")
			if names == "" {
				names = "-"
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", s.SnapshotID, names, dash(s.SandboxID), dash(s.TemplateID),
				formatBytes(s.SizeBytes), s.CreatedAt.Local().Format(time.DateTime))
		})
	rm := removeCmd(g, "Delete snapshots", (*client.Client).DeleteSnapshot)
	cmd.AddCommand(ls, rm)
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newMetricsCmd(g *globals) *cobra.Command {
	var (
		output string
		since  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "metrics ID",
		Short: "Show a sandbox's CPU, memory and disk use over its life",
		Long: `Show the resource samples of sandbox ID, taken every 5 seconds by its node
for as long as it runs (kept for a bounded time; see the server's docs).`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var start time.Time
			if since > 0 {
				start = time.Now().Add(-since)
			}
			ms, err := c.SandboxMetrics(cmd.Context(), args[0], start, time.Time{})
			if err != nil {
				return err
			}
			if output == "json" {
				return writeJSON(cmd.OutOrStdout(), ms)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tCPU\tMEMORY\tDISK")
			for _, m := range ms {
				fmt.Fprintf(tw, "%s\t%.1f%% of %d\t%s / %s\t%s / %s\n", m.Timestamp.Local().Format(time.TimeOnly), m.CPUUsedPct, m.CPUCount,
					formatBytes(int64(m.MemUsed)), formatBytes(int64(m.MemTotal)), formatBytes(int64(m.DiskUsed)), formatBytes(int64(m.DiskTotal)))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().DurationVar(&since, "since", 0, "only samples this recent (e.g. 10m)")
	outputFlag(cmd, &output)
	return cmd
}

func newLogsCmd(g *globals) *cobra.Command {
	var (
		follow bool
		output string
	)
	cmd := &cobra.Command{
		Use:   "logs ID",
		Short: "Show a sandbox's log: its lifecycle and the processes it ran",
		Long: `Show the log of sandbox ID: when it was created, paused, resumed or
killed, and each process envd started and how it ended. With -f, keep
printing new entries until the sandbox ends.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var cursor time.Time
			seen := map[string]bool{}
			for {
				entries, err := c.Logs(cmd.Context(), args[0], cursor)
				if err != nil {
					if follow && !cursor.IsZero() && client.IsStatus(err, 404) {
						return nil // it ended
					}
					return err
				}
				for _, e := range entries {
					// The cursor is inclusive: entries at its millisecond
					// come again.
					key := e.Timestamp.String() + e.Message + fmt.Sprint(e.Fields)
					if seen[key] {
						continue
					}
					seen[key] = true
					cursor = e.Timestamp
					if output == "json" {
						if err := writeJSONLine(cmd.OutOrStdout(), e); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s %-5s %s%s\n", e.Timestamp.Local().Format("2006-01-02 15:04:05.000"),
						strings.ToUpper(e.Level), e.Message, formatFields(e.Fields))
				}
				if !follow {
					return nil
				}
				select {
				case <-cmd.Context().Done():
					return nil
				case <-time.After(time.Second):
				}
				if cursor.IsZero() {
					cursor = time.Now().Add(-time.Second)
				}
			}
		},
	}
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "keep printing new entries")
	outputFlag(cmd, &output)
	return cmd
}

// formatFields renders a log entry's fields as " k=v ...", sorted.
func formatFields(f map[string]string) string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		v := f[k]
		if strings.ContainsAny(v, " \"=") {
			v = strconv.Quote(v)
		}
		fmt.Fprintf(&b, " %s=%s", k, v)
	}
	return b.String()
}

// writeJSONLine writes v as one line of JSON (a stream of entries).
func writeJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func newVolumeCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Manage volumes: directories that outlive sandboxes and are shared by those that mount them",
		Long: `A volume is a directory on one node that sandboxes mount read-write
('aenv create --volume NAME:/path', or volumeMounts in the SDK); it outlives
them, and every sandbox that mounts it sees the same files. Sandboxes that
mount a volume run on its node. The SDK's Volume class reads and writes
its files directly (set E2B_VOLUME_API_URL to the server's URL).`,
	}
	var sizeMB int64
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a volume and print its id",
		Args:  needArgs("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), args[0], client.VolumeOptions{SizeMB: sizeMB})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), v.VolumeID)
			return nil
		},
	}
	create.Flags().Int64Var(&sizeMB, "size", 0, "the volume's size in MiB: past it writes fail with ENOSPC (default: the node's --volume-size)")
	ls := listCmd(g, &cobra.Command{Use: "ls", Aliases: []string{"list"}, Short: "List volumes"},
		(*client.Client).ListVolumes, "ID\tNAME\tSIZE", func(v client.Volume) string {
			size := "unbounded" // a volume from before sizes
			if v.SizeMB > 0 {
				size = fmt.Sprintf("%d MiB", v.SizeMB)
			}
			return v.VolumeID + "\t" + v.Name + "\t" + size
		})
	rm := removeCmd(g, "Delete volumes and their files (refused while a sandbox mounts one)", (*client.Client).DeleteVolume)
	cmd.AddCommand(create, ls, rm)
	return cmd
}

// removeCmd is an "rm ID..." subcommand deleting each id with del and
// printing it.
func removeCmd(g *globals, short string, del func(*client.Client, context.Context, string) error) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete"},
		Short:   short,
		Args:    needArgs("ID..."),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := del(c, cmd.Context(), id); err != nil {
					return err
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			return nil
		},
	}
}
