package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
)

// keepaliveSeconds asks envd for a keepalive event this often on process
// streams, so that idle interactive sessions are not cut by proxies.
const keepaliveSeconds = "30"

// ProcessOptions describes a process to start in a sandbox.
type ProcessOptions struct {
	// Cmd and Args are the program and its arguments.
	Cmd  string
	Args []string
	// Envs are added to the process's environment; Cwd is its working
	// directory (default: the user's home).
	Envs map[string]string
	Cwd  string
	// User runs the process as this user (default: the sandbox's default).
	User string
	// AccessToken is the sandbox's envd token, if it has one.
	AccessToken string
	// PTY, when set, runs the process on a pseudo-terminal of that size.
	// Its output then arrives, stdout and stderr merged, on Stdout.
	PTY *WindowSize
	// Stdin keeps the process's stdin open for SendInput. A PTY always
	// takes input.
	Stdin bool
	// Stdout and Stderr receive the output as it arrives.
	Stdout, Stderr io.Writer
}

// WindowSize is a terminal's size in characters.
type WindowSize struct {
	Cols, Rows uint16
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	// Code is the exit code when Exited, else -1.
	Code int
	// Exited is false when a signal killed the process.
	Exited bool
	// Status is envd's description: "exit status 3", "signal: killed".
	Status string
}

// ExitCode is the status as a shell reports it: the exit code, or 128 plus
// the signal's number for a process a signal killed.
func (s ExitStatus) ExitCode() int {
	if s.Exited {
		return s.Code
	}
	name, _ := strings.CutPrefix(s.Status, "signal: ")
	name, _ = strings.CutSuffix(name, " (core dumped)")
	for sig := syscall.Signal(1); sig < 65; sig++ {
		if sig.String() == name {
			return 128 + int(sig)
		}
	}
	return 255
}

// Process is a process started in a sandbox. Wait must be called to
// receive its output and exit status; the other methods may be called
// concurrently with Wait.
type Process struct {
	pid    uint32
	svc    processconnect.ProcessClient
	stream *connect.ServerStreamForClient[process.StartResponse]
	pty    bool
	stdout io.Writer
	stderr io.Writer
}

// StartProcess starts a process in sandbox id and returns once envd has
// started it. ctx bounds the whole process: when it is cancelled the
// output stops, and when its deadline passes envd kills the process.
func (c *Client) StartProcess(ctx context.Context, id string, opts ProcessOptions) (*Process, error) {
	svc := c.Process(id, RunOptions{User: opts.User, AccessToken: opts.AccessToken})
	stdin := opts.Stdin || opts.PTY != nil
	req := &process.StartRequest{
		Process: &process.ProcessConfig{
			Cmd:  opts.Cmd,
			Args: opts.Args,
			Envs: opts.Envs,
			Cwd:  optional(opts.Cwd),
		},
		Stdin: &stdin,
	}
	if opts.PTY != nil {
		req.Pty = &process.PTY{Size: &process.PTY_Size{Cols: uint32(opts.PTY.Cols), Rows: uint32(opts.PTY.Rows)}}
	}
	stream, err := svc.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", opts.Cmd, err)
	}
	p := &Process{svc: svc, stream: stream, pty: opts.PTY != nil, stdout: opts.Stdout, stderr: opts.Stderr}
	// The first event names the process; nothing can be sent to it before.
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if st := ev.GetStart(); st != nil {
			p.pid = st.GetPid()
			return p, nil
		}
		if ev.GetKeepalive() == nil {
			break
		}
	}
	err = stream.Err()
	stream.Close()
	if err == nil {
		err = errors.New("envd ended the stream before the process started")
	}
	return nil, fmt.Errorf("starting %s: %w", opts.Cmd, err)
}

// PID is the process's id inside the sandbox.
func (p *Process) PID() uint32 { return p.pid }

func (p *Process) selector() *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: p.pid}}
}

// Wait streams the output to the writers until the process ends and
// returns how it ended. An error means the stream broke (or its context
// ended) before the end; the process may still be running then.
func (p *Process) Wait() (ExitStatus, error) {
	defer p.stream.Close()
	for p.stream.Receive() {
		ev := p.stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			var err error
			switch out := d.GetOutput().(type) {
			case *process.ProcessEvent_DataEvent_Stdout:
				err = write(p.stdout, out.Stdout)
			case *process.ProcessEvent_DataEvent_Pty:
				err = write(p.stdout, out.Pty)
			case *process.ProcessEvent_DataEvent_Stderr:
				err = write(p.stderr, out.Stderr)
			}
			if err != nil {
				return ExitStatus{}, fmt.Errorf("writing the output of process %d: %w", p.pid, err)
			}
		}
		if end := ev.GetEnd(); end != nil {
			st := ExitStatus{Code: int(end.GetExitCode()), Exited: end.GetExited(), Status: end.GetStatus()}
			if !st.Exited {
				st.Code = -1
				if st.Status == "" {
					st.Status = end.GetError()
				}
			}
			// envd ends the stream right after: read to its end, so that
			// the connection (and the proxy's, through to the sandbox's
			// node) is kept for the next call rather than cut here.
			for p.stream.Receive() {
			}
			return st, nil
		}
	}
	if err := p.stream.Err(); err != nil {
		return ExitStatus{}, fmt.Errorf("reading the output of process %d: %w", p.pid, err)
	}
	return ExitStatus{}, fmt.Errorf("reading the output of process %d: stream ended without an exit status", p.pid)
}

func write(w io.Writer, b []byte) error {
	if w == nil || len(b) == 0 {
		return nil
	}
	_, err := w.Write(b)
	return err
}

// SendInput writes data to the process's pty, or its stdin when it has no
// pty.
func (p *Process) SendInput(ctx context.Context, data []byte) error {
	in := &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: data}}
	if p.pty {
		in.Input = &process.ProcessInput_Pty{Pty: data}
	}
	_, err := p.svc.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: p.selector(), Input: in}))
	if err != nil {
		return fmt.Errorf("sending input to process %d: %w", p.pid, err)
	}
	return nil
}

// CloseStdin makes the process read end-of-file.
func (p *Process) CloseStdin(ctx context.Context) error {
	_, err := p.svc.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: p.selector()}))
	if err != nil {
		return fmt.Errorf("closing the stdin of process %d: %w", p.pid, err)
	}
	return nil
}

// Resize changes the size of the process's pty.
func (p *Process) Resize(ctx context.Context, size WindowSize) error {
	_, err := p.svc.Update(ctx, connect.NewRequest(&process.UpdateRequest{
		Process: p.selector(),
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: uint32(size.Cols), Rows: uint32(size.Rows)}},
	}))
	if err != nil {
		return fmt.Errorf("resizing the terminal of process %d: %w", p.pid, err)
	}
	return nil
}

// Kill sends SIGKILL to the process.
func (p *Process) Kill(ctx context.Context) error {
	_, err := p.svc.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
		Process: p.selector(),
		Signal:  process.Signal_SIGNAL_SIGKILL,
	}))
	if err != nil {
		return fmt.Errorf("killing process %d: %w", p.pid, err)
	}
	return nil
}
