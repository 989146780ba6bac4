package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/aenvhq/aenv/internal/client"
)

// The shell 'aenv start' and 'aenv connect' open.
var shellCmd = []string{"/bin/bash", "-l"}

// Input is sent in batches of at most this many bytes; keystrokes typed
// while one SendInput is in flight travel together in the next.
const maxInputBatch = 32 << 10

func newStartCmd(g *globals) *cobra.Command {
	var f createFlags
	var detach, keep bool
	var so shellOptions
	cmd := &cobra.Command{
		Use:   "start TEMPLATE",
		Short: "Create a sandbox and open a shell in it",
		Long: `Create a sandbox from TEMPLATE and open an interactive shell (/bin/bash -l)
in it on a terminal: keys, Ctrl-C and window size go to the sandbox, and
aenv exits with the shell's exit status. The sandbox is kept alive while
the shell is open and killed when it exits, unless --keep.

With -d, print the sandbox's id and return instead (like 'aenv create').
When stdin is not a terminal, the shell reads it as a script, without a
terminal: 'echo "uname -a" | aenv start base'.`,
		Example: `  aenv start base
  aenv start base --cpu 2 --memory 2048 --keep
  id=$(aenv start -d base)`,
		Args: needArgs("TEMPLATE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts, err := f.options(cmd, args[0])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			sb, err := c.Create(ctx, opts)
			if err != nil {
				return err
			}
			if detach {
				fmt.Fprintln(cmd.OutOrStdout(), sb.SandboxID)
				return nil
			}
			so.keepAlive = time.Duration(opts.Timeout) * time.Second
			so.accessToken = sb.EnvdAccessToken
			if _, tty := terminalFd(cmd.InOrStdin()); tty {
				fate := "killed when the shell exits"
				if keep {
					fate = "kept when the shell exits"
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "Sandbox %s (%s), %s.\n", sb.SandboxID, sb.TemplateID, fate)
			}
			so.id = sb.SandboxID
			shellErr := openShell(ctx, cmd, c, so)
			if keep {
				return shellErr
			}
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			if err := c.Kill(kctx, sb.SandboxID); err != nil && !client.IsStatus(err, http.StatusNotFound) {
				return errors.Join(shellErr, err)
			}
			return shellErr
		},
	}
	f.add(cmd)
	so.add(cmd)
	cmd.Flags().BoolVarP(&detach, "detach", "d", false, "print the sandbox's id and return without a shell")
	cmd.Flags().BoolVar(&keep, "keep", false, "leave the sandbox running when the shell exits")
	return cmd
}

func newConnectCmd(g *globals) *cobra.Command {
	var so shellOptions
	var timeout int
	cmd := &cobra.Command{
		Use:   "connect ID",
		Short: "Open a shell in a running sandbox",
		Long: `Open an interactive shell (/bin/bash -l) in sandbox ID, resuming it first
if it is paused. The sandbox is kept alive for at least --timeout seconds
from now, and as long as the shell is open; it is never killed by this
command. aenv exits with the shell's exit status.`,
		Args: needArgs("ID"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout <= 0 {
				return &usageError{cmd: cmd, err: fmt.Errorf("--timeout must be a positive number of seconds, got %d", timeout)}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			d := time.Duration(timeout) * time.Second
			sb, resumed, err := c.Connect(cmd.Context(), args[0], d)
			if err != nil {
				return err
			}
			if resumed {
				fmt.Fprintf(cmd.ErrOrStderr(), "Resumed sandbox %s.\n", args[0])
			}
			so.keepAlive = d
			so.accessToken = sb.EnvdAccessToken
			so.id = args[0]
			return openShell(cmd.Context(), cmd, c, so)
		},
	}
	so.add(cmd)
	cmd.Flags().IntVar(&timeout, "timeout", 300, "seconds the sandbox lives at least from now")
	return cmd
}

// shellOptions configure openShell.
type shellOptions struct {
	// id is the sandbox.
	id          string
	user, cwd   string
	accessToken string
	// keepAlive is how long the sandbox is kept alive past the last
	// refresh while the shell is open.
	keepAlive time.Duration
}

func (o *shellOptions) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.user, "user", "", "run the shell as this user: root or user (default: the sandbox's default, user)")
	cmd.Flags().StringVar(&o.cwd, "cwd", "", "the shell's working directory (default: the user's home)")
}

// openShell runs the shell in sandbox o.id on cmd's streams and returns
// its exit status as an exitError (nil for 0).
func openShell(ctx context.Context, cmd *cobra.Command, c *client.Client, o shellOptions) error {
	id := o.id
	ctx, stopSignals := hangupContext(ctx)
	defer stopSignals()
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go keepAlive(streamCtx, c, id, o.keepAlive)

	in := cmd.InOrStdin()
	fd, tty := terminalFd(in)
	popts := client.ProcessOptions{
		Cmd:         shellCmd[0],
		Args:        shellCmd[1:],
		Cwd:         o.cwd,
		User:        o.user,
		AccessToken: o.accessToken,
		Stdout:      cmd.OutOrStdout(),
		Stderr:      cmd.ErrOrStderr(),
		Stdin:       true,
	}
	if tty {
		size := client.WindowSize{Cols: 80, Rows: 24}
		if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
			size = client.WindowSize{Cols: uint16(w), Rows: uint16(h)}
		}
		popts.PTY = &size
	}
	p, err := c.StartProcess(streamCtx, id, popts)
	if err != nil {
		return fmt.Errorf("opening a shell in %s: %w", id, err)
	}

	if tty {
		old, err := term.MakeRaw(fd)
		if err != nil {
			kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer kcancel()
			_ = p.Kill(kctx)
			return fmt.Errorf("opening a shell in %s: putting the terminal in raw mode: %w", id, err)
		}
		defer term.Restore(fd, old)
		stopResize := onResize(func() {
			if w, h, err := term.GetSize(fd); err == nil && w > 0 && h > 0 {
				_ = p.Resize(streamCtx, client.WindowSize{Cols: uint16(w), Rows: uint16(h)})
			}
		})
		defer stopResize()
		// Ctrl-C, Ctrl-D and the rest are bytes like any other here: the
		// sandbox's terminal gives them their meaning.
		go forwardInput(in, func(b []byte) error { return p.SendInput(streamCtx, b) })
	} else {
		go func() {
			if forwardInput(in, func(b []byte) error { return p.SendInput(streamCtx, b) }) == nil {
				_ = p.CloseStdin(streamCtx)
			}
		}()
	}

	st, err := p.Wait()
	if err != nil {
		return earlyEnd{user: ctx, limited: streamCtx, what: "the shell", id: id}.explain(p, err)
	}
	if code := st.ExitCode(); code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// forwardInput sends what it reads from in, in order, until EOF (nil) or
// a read or send failure. Reads that arrive while a send is in flight are
// batched into the next one.
func forwardInput(in io.Reader, send func([]byte) error) error {
	chunks := make(chan []byte, 64)
	readErr := make(chan error, 1)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 16<<10)
			n, err := in.Read(buf)
			if n > 0 {
				chunks <- buf[:n]
			}
			if err != nil {
				if !errors.Is(err, io.EOF) {
					readErr <- err
				}
				return
			}
		}
	}()
	for chunk := range chunks {
		batch := chunk
	more:
		for len(batch) < maxInputBatch {
			select {
			case next, ok := <-chunks:
				if !ok {
					break more
				}
				batch = append(batch, next...)
			default:
				break more
			}
		}
		if err := send(batch); err != nil {
			go func() {
				for range chunks {
				}
			}()
			return err
		}
	}
	select {
	case err := <-readErr:
		return err
	default:
		return nil
	}
}

// keepAlive refreshes the sandbox's deadline to d from now, every d/3 (at
// most every minute), until ctx ends.
func keepAlive(ctx context.Context, c *client.Client, id string, d time.Duration) {
	if d <= 0 {
		return
	}
	every := min(d/3, time.Minute)
	every = max(every, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			rctx, cancel := context.WithTimeout(ctx, every)
			_ = c.Refresh(rctx, id, d)
			cancel()
		}
	}
}
