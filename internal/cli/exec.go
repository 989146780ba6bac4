package cli

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/client"
)

// codeError is a failure that also decides the exit code (124 for a
// timeout, 130 for an interrupt), as shells and timeout(1) do.
type codeError struct {
	code int
	err  error
}

func (e *codeError) Error() string { return e.err.Error() }
func (e *codeError) Unwrap() error { return e.err }

// Exit codes borrowed from timeout(1) and the shells.
const (
	exitTimedOut    = 124
	exitInterrupted = 130
)

// cleanupTimeout bounds the calls made after the user's context has ended
// (killing a process or a sandbox on the way out).
const cleanupTimeout = 30 * time.Second

func newExecCmd(g *globals) *cobra.Command {
	var user, cwd string
	var envs []string
	var timeout int
	cmd := &cobra.Command{
		Use:   "exec ID [--] COMMAND [ARGS...]",
		Short: "Run a command in a sandbox, streaming its output",
		Long: `Run a command in sandbox ID with /bin/bash -l -c, streaming its stdout and
stderr as they arrive; aenv exits with the command's exit code (128+N when
signal N killed it, 124 when --timeout passed, 130 when interrupted).

A single COMMAND is a shell script, as typed; several words are quoted
and run as one command line, so 'aenv exec ID -- printf "%s\n" "a b"'
passes "a b" as one argument. Everything after ID is the command: aenv's
flags go before ID. Ctrl-C kills the command.`,
		Example: `  aenv exec abc123 -- 'cd /tmp && ls -la | head'
  aenv exec --env DEBUG=1 --timeout 60 abc123 -- python3 -c 'print(42)'`,
		Args: func(cmd *cobra.Command, args []string) error {
			return atLeastArgs("ID", "COMMAND")(cmd, stripDash(args))
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			args = stripDash(args)
			id, words := args[0], args[1:]
			script := words[0]
			if len(words) > 1 {
				script = shellJoin(words)
			}
			envMap, err := parsePairs(cmd, "env", envs)
			if err != nil {
				return err
			}
			if timeout < 0 {
				return &usageError{cmd: cmd, err: fmt.Errorf("--timeout must not be negative, got %d", timeout)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			sb, err := c.Get(cmd.Context(), id)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(timeout)*time.Second)
				defer cancel()
			}
			p, err := c.StartProcess(ctx, id, client.ProcessOptions{
				Cmd:         "/bin/bash",
				Args:        []string{"-l", "-c", script},
				Envs:        envMap,
				Cwd:         cwd,
				User:        user,
				AccessToken: sb.EnvdAccessToken,
				Stdout:      cmd.OutOrStdout(),
				Stderr:      cmd.ErrOrStderr(),
			})
			if err != nil {
				return fmt.Errorf("running command in %s: %w", id, err)
			}
			st, err := p.Wait()
			if err != nil {
				return earlyEnd{user: cmd.Context(), limited: ctx, timeout: timeout, what: "command", id: id}.explain(p, err)
			}
			if !st.Exited {
				return &codeError{code: st.ExitCode(), err: fmt.Errorf("running command in %s: %s", id, st.Status)}
			}
			if st.Code != 0 {
				return &exitError{code: st.Code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false)
	f.StringVar(&user, "user", "", "run as this user: root or user (default: the sandbox's default, user)")
	f.StringVar(&cwd, "cwd", "", "working directory (default: the user's home)")
	f.StringArrayVar(&envs, "env", nil, "KEY=VALUE environment variable (repeatable)")
	f.IntVar(&timeout, "timeout", 0, "seconds after which the command is killed (0: no limit)")
	return cmd
}

// earlyEnd explains a process stream that broke before the process
// ended: the user interrupted, --timeout passed, or the connection failed.
type earlyEnd struct {
	// user is cancelled when the user interrupts; limited is user with
	// the --timeout deadline, if any.
	user, limited context.Context
	timeout       int
	what, id      string
}

// explain returns the error to report for err. Unless envd already did,
// the process is killed so that it does not run on unwatched.
func (e earlyEnd) explain(p *client.Process, err error) error {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(e.user), cleanupTimeout)
	defer cancel()
	switch {
	case e.user.Err() != nil:
		_ = p.Kill(kctx)
		return &codeError{code: exitInterrupted, err: fmt.Errorf("running %s in %s: interrupted", e.what, e.id)}
	case errors.Is(e.limited.Err(), context.DeadlineExceeded),
		// envd may notice the deadline a moment before this side does.
		e.timeout > 0 && connect.CodeOf(err) == connect.CodeDeadlineExceeded:
		_ = p.Kill(kctx)
		return &codeError{code: exitTimedOut, err: fmt.Errorf("running %s in %s: timed out after %ds", e.what, e.id, e.timeout)}
	}
	return fmt.Errorf("running %s in %s: %w", e.what, e.id, err)
}

// stripDash drops the "--" that may separate ID from the command: with
// flags parsed only before ID, cobra leaves it in the arguments.
func stripDash(args []string) []string {
	if len(args) >= 2 && args[1] == "--" {
		return append([]string{args[0]}, args[2:]...)
	}
	return args
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_@%+=:,./-]+$`)

// shellJoin quotes words for bash so that each stays one argument.
func shellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		if shellSafe.MatchString(w) {
			q[i] = w
		} else {
			q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}
