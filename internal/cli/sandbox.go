package cli

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

// needArgs accepts exactly the named positional arguments and names the
// missing ones.
func needArgs(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) < len(names) {
			return fmt.Errorf("missing %s", strings.Join(names[len(args):], " and "))
		}
		if len(args) > len(names) {
			return fmt.Errorf("unexpected argument %q", args[len(names)])
		}
		return nil
	}
}

// atLeastArgs accepts the named positional arguments and any more after.
func atLeastArgs(names ...string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) < len(names) {
			return fmt.Errorf("missing %s", strings.Join(names[len(args):], " and "))
		}
		return nil
	}
}

// createFlags are the flags of the commands that create a sandbox.
type createFlags struct {
	opts     client.CreateOptions
	metadata []string
	envs     []string
	volumes  []string
	allowOut []string
	denyOut  []string
}

func (f *createFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.IntVar(&f.opts.Timeout, "timeout", 300, "seconds until the sandbox is killed")
	fl.IntVar(&f.opts.CPUCount, "cpu", 0, "vCPUs (default: the template's)")
	fl.IntVar(&f.opts.MemoryMB, "memory", 0, "memory in MiB (default: the template's)")
	fl.StringArrayVar(&f.metadata, "metadata", nil, "KEY=VALUE metadata to attach (repeatable; 'aenv ls --metadata' filters on it)")
	fl.StringArrayVar(&f.envs, "env", nil, "KEY=VALUE environment variable for every process in the sandbox (repeatable)")
	fl.BoolVar(&f.opts.Secure, "secure", false, "make envd demand the sandbox's access token (aenv passes it on by itself)")
	fl.StringSliceVar(&f.allowOut, "allow-out", nil, "CIDR, address or domain (*.example.com: its subdomains) the sandbox may reach even where --deny-out covers it (repeatable)")
	fl.StringSliceVar(&f.denyOut, "deny-out", nil, "CIDR or address the sandbox may not reach; --deny-out 0.0.0.0/0 with --allow-out makes an allowlist (repeatable)")
	fl.StringArrayVar(&f.volumes, "volume", nil, "NAME:/path mounts volume NAME (aenv volume create) read-write at /path (repeatable)")
}

// options validates the flags and returns the request for template.
func (f *createFlags) options(cmd *cobra.Command, template string) (client.CreateOptions, error) {
	o := f.opts
	o.TemplateID = template
	if o.Timeout <= 0 {
		return o, &usageError{cmd: cmd, err: fmt.Errorf("--timeout must be a positive number of seconds, got %d", o.Timeout)}
	}
	if o.CPUCount < 0 || o.MemoryMB < 0 {
		return o, &usageError{cmd: cmd, err: fmt.Errorf("--cpu and --memory must not be negative")}
	}
	var err error
	if o.Metadata, err = parsePairs(cmd, "metadata", f.metadata); err != nil {
		return o, err
	}
	if o.EnvVars, err = parsePairs(cmd, "env", f.envs); err != nil {
		return o, err
	}
	if len(f.allowOut) > 0 || len(f.denyOut) > 0 {
		o.Network = &client.Network{AllowOut: f.allowOut, DenyOut: f.denyOut}
	}
	for _, v := range f.volumes {
		name, p, ok := strings.Cut(v, ":")
		if !ok || name == "" || !strings.HasPrefix(p, "/") {
			return o, &usageError{cmd: cmd, err: fmt.Errorf("--volume wants NAME:/absolute/path, got %q", v)}
		}
		o.VolumeMounts = append(o.VolumeMounts, client.VolumeMount{Name: name, Path: p})
	}
	return o, nil
}

func newCreateCmd(g *globals) *cobra.Command {
	var f createFlags
	var count int
	var atomic bool
	cmd := &cobra.Command{
		Use:   "create [TEMPLATE]",
		Short: "Create sandboxes and print their ids",
		Long: `Create a sandbox from TEMPLATE (default: base) and print its id. It runs
until --timeout passes or 'aenv rm' kills it. 'aenv start' creates one and
opens a shell in it.

With -n N, N sandboxes are created in one call, placed across the nodes;
each id is printed as soon as that sandbox is ready, and each failure
(with its reason) goes to stderr, the command failing if any did. With
--atomic it is all or none: if one cannot be made, the others are removed
and nothing is printed.`,
		Example: `  id=$(aenv create base --timeout 600 --metadata owner=ci)
  aenv exec "$id" -- uname -a
  aenv create base -n 64 --metadata step=17 > ids.txt`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tmpl := "base"
			if len(args) == 1 {
				tmpl = args[0]
			}
			opts, err := f.options(cmd, tmpl)
			if err != nil {
				return err
			}
			if count < 1 {
				return &usageError{cmd: cmd, err: fmt.Errorf("-n must be at least 1, got %d", count)}
			}
			if atomic && count == 1 {
				atomic = false // one create is all or nothing already
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			switch {
			case count == 1:
				sb, err := c.Create(cmd.Context(), opts)
				if err != nil {
					return err
				}
				fmt.Fprintln(out, sb.SandboxID)
				return nil
			case atomic:
				sbs, err := c.CreateAtomic(cmd.Context(), opts, count)
				if err != nil {
					return err
				}
				for _, sb := range sbs {
					fmt.Fprintln(out, sb.SandboxID)
				}
				return nil
			}
			start, failed := time.Now(), 0
			made, err := c.CreateBatch(cmd.Context(), opts, count, func(r client.BatchResult) {
				if r.Err != nil {
					failed++
					fmt.Fprintf(cmd.ErrOrStderr(), "sandbox %d of %d: %v\n", r.Index+1, count, r.Err)
					return
				}
				fmt.Fprintln(out, r.Sandbox.SandboxID)
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "created %d of %d sandboxes in %s\n", made, count, time.Since(start).Round(time.Millisecond))
			if failed > 0 {
				return fmt.Errorf("%d of %d sandboxes could not be created (reasons above)", failed, count)
			}
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().IntVarP(&count, "count", "n", 1, "how many sandboxes to create, in one call")
	cmd.Flags().BoolVar(&atomic, "atomic", false, "with -n: all or none (one failure removes the others)")
	return cmd
}

func newListCmd(g *globals) *cobra.Command {
	var output string
	var metadata, states []string
	cmd := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List sandboxes",
		Long: `List sandboxes, oldest first. --metadata keeps those whose metadata has
every given pair; --state keeps those in the given states (running,
paused; default: all).`,
		Example: `  aenv ls
  aenv ls --metadata owner=ci --state running -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(cmd, output); err != nil {
				return err
			}
			md, err := parsePairs(cmd, "metadata", metadata)
			if err != nil {
				return err
			}
			var st []string
			for _, s := range states {
				for _, one := range strings.Split(s, ",") {
					if one != "running" && one != "paused" {
						return &usageError{cmd: cmd, err: fmt.Errorf("unknown --state %q: want running or paused", one)}
					}
					st = append(st, one)
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.ListWith(cmd.Context(), client.ListOptions{Metadata: md, States: st})
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return writeJSON(out, list)
			}
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tTEMPLATE\tSTATE\tCPU\tMEMORY\tSTARTED\tENDS\tMETADATA")
			for _, sb := range list {
				state := sb.State
				if sb.IdlePaused {
					state += " (idle)" // resumes on its next request
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%dMiB\t%s\t%s\t%s\n", sb.SandboxID, sb.TemplateID, state,
					sb.CPUCount, sb.MemoryMB, sb.StartedAt.Local().Format(time.DateTime), sb.EndAt.Local().Format(time.DateTime),
					formatPairs(sb.Metadata))
			}
			return tw.Flush()
		},
	}
	outputFlag(cmd, &output)
	cmd.Flags().StringArrayVar(&metadata, "metadata", nil, "KEY=VALUE the sandbox's metadata must have (repeatable)")
	cmd.Flags().StringSliceVar(&states, "state", nil, "running and/or paused (comma-separated or repeated)")
	return cmd
}

func formatPairs(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// removeParallelism bounds the kills in flight for one 'aenv rm'.
const removeParallelism = 8

func newRemoveCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"kill"},
		Short:   "Kill sandboxes",
		Long: `Kill the given sandboxes and print the id of each one killed. When any
of them cannot be killed (unknown id, ...) aenv says why and exits 1; the
others are still killed.`,
		Args: atLeastArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			errs := make([]error, len(args))
			var wg sync.WaitGroup
			sem := make(chan struct{}, removeParallelism)
			for i, id := range args {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					errs[i] = c.Kill(cmd.Context(), id)
				}()
			}
			wg.Wait()
			failed := false
			for i, id := range args {
				if errs[i] != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "aenv:", oneLine(errs[i]))
					failed = true
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			if failed {
				return &exitError{code: 1}
			}
			return nil
		},
	}
}

// parseSeconds reads a positive number of seconds.
func parseSeconds(cmd *cobra.Command, s string) (time.Duration, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > 1<<31 {
		return 0, &usageError{cmd: cmd, err: fmt.Errorf("SECONDS must be a positive whole number, got %q", s)}
	}
	return time.Duration(n) * time.Second, nil
}

func newTimeoutCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "timeout ID SECONDS",
		Short: "Set when a sandbox is killed",
		Long: `Set sandbox ID to be killed SECONDS from now, earlier or later than it
was due. The server caps SECONDS.`,
		Example: "  aenv timeout abc123 3600",
		Args:    needArgs("ID", "SECONDS"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseSeconds(cmd, args[1])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.SetTimeout(cmd.Context(), args[0], d); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s is killed at %s\n", args[0], time.Now().Add(d).Local().Format(time.DateTime))
			return nil
		},
	}
}

func newPauseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "pause ID",
		Short: "Pause a sandbox",
		Long: `Pause sandbox ID: its whole state (processes, memory, files) is saved
and its CPU and memory go back to the host; 'aenv resume' or 'aenv connect'
brings it back, on this server even after a restart.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if err := c.Pause(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), args[0])
			return nil
		},
	}
}

func newResumeCmd(g *globals) *cobra.Command {
	var timeout int
	cmd := &cobra.Command{
		Use:   "resume ID",
		Short: "Resume a paused sandbox",
		Long: `Resume sandbox ID if it is paused and keep it alive for at least
--timeout seconds. A running sandbox is left running.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return &usageError{cmd: cmd, err: fmt.Errorf("--timeout must be a positive number of seconds, got %d", timeout)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			_, resumed, err := c.Connect(cmd.Context(), args[0], time.Duration(timeout)*time.Second)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), args[0])
			if !resumed {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s was not paused; it keeps running\n", args[0])
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&timeout, "timeout", 300, "seconds the sandbox lives at least from now")
	return cmd
}
