package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

func newCreateCmd(g *globals) *cobra.Command {
	var opts client.CreateOptions
	cmd := &cobra.Command{
		Use:   "create [TEMPLATE]",
		Short: "Create a sandbox and print its id",
		Long:  "Create a sandbox from TEMPLATE (default: base) and print its id.",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				opts.TemplateID = args[0]
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Create(cmd.Context(), opts)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), sb.SandboxID)
			return nil
		},
	}
	cmd.Flags().IntVar(&opts.Timeout, "timeout", 300, "seconds until the sandbox is killed")
	cmd.Flags().IntVar(&opts.CPUCount, "cpu", 0, "vCPUs (default: the template's)")
	cmd.Flags().IntVar(&opts.MemoryMB, "memory", 0, "memory in MiB (default: the template's)")
	return cmd
}

func newExecCmd(g *globals) *cobra.Command {
	var user, cwd string
	cmd := &cobra.Command{
		Use:   "exec ID -- COMMAND [ARGS...]",
		Short: "Run a command in a sandbox, streaming its output",
		Long: `Run a command in a sandbox with /bin/bash -l -c, streaming stdout and
stderr as they arrive; aenv exits with the command's exit code.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			code, err := c.Run(cmd.Context(), args[0], strings.Join(args[1:], " "), client.RunOptions{
				Stdout: os.Stdout, Stderr: os.Stderr, User: user, Cwd: cwd,
				AccessToken: sb.EnvdAccessToken,
			})
			if err != nil {
				return err
			}
			if code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&user, "user", "", "run as this user (root or user; default user)")
	cmd.Flags().StringVar(&cwd, "cwd", "", "working directory (default: the user's home)")
	return cmd
}

func newListCmd(g *globals) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List running sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.List(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch output {
			case "json":
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			case "table":
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tCPU\tMEMORY\tSTARTED\tENDS")
				for _, sb := range list {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dMiB\t%s\t%s\n", sb.SandboxID, sb.TemplateID, sb.State,
						sb.CPUCount, sb.MemoryMB, sb.StartedAt.Local().Format(time.DateTime), sb.EndAt.Local().Format(time.DateTime))
				}
				return tw.Flush()
			default:
				return fmt.Errorf("unknown --output %q (table or json)", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func newRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"kill"},
		Short:   "Kill sandboxes",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var failed int
			for _, id := range args {
				if err := c.Kill(cmd.Context(), id); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "aenv:", err)
					failed++
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			if failed > 0 {
				return &exitError{code: 1}
			}
			return nil
		},
	}
}
