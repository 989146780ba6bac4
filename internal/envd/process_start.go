package envd

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// Start runs a command and streams its events: start{pid} first, output as
// it is produced, then end. The request deadline (Connect-Timeout-Ms, the
// SDK's timeoutMs) bounds the process itself: when it passes, the process
// is killed even if its client has gone. A client that merely disconnects
// leaves the process running; that is how background commands work.
func (ps *processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	s := ps.s
	u, err := s.userFromHeader(req.Header())
	if err != nil {
		return connectError(err)
	}
	msg := req.Msg
	cfg := msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("starting process: %w: no command", errInvalid))
	}
	switchUser, err := canSwitchUser(u)
	if err != nil {
		return connectError(err)
	}
	dir, err := s.workdir(u, cfg.GetCwd())
	if err != nil {
		return connectError(err)
	}
	spec := spawnSpec{
		argv:       append([]string{shellFallback(cfg.GetCmd())}, cfg.GetArgs()...),
		env:        s.processEnv(u, cfg.GetEnvs(), msg.Pty != nil),
		dir:        dir,
		user:       u,
		switchUser: switchUser,
		// Clients older than envd 0.3.0 could not ask; they always had stdin.
		stdin: msg.Stdin == nil || msg.GetStdin(),
	}
	if msg.Pty != nil {
		size := msg.GetPty().GetSize()
		spec.pty = &ptySize{cols: clampU16(size.GetCols(), 80), rows: clampU16(size.GetRows(), 24)}
	}

	c, ready := s.shells.take(spec)
	if !ready {
		if c, err = s.spawn(spec); err != nil {
			return connectError(fmt.Errorf("starting process %s: %w", cfg.GetCmd(), err))
		}
	}
	recorded := proto.CloneOf(cfg)
	recorded.Cwd = &dir
	p := newProc(c, recorded, msg.Tag, s.reaper)
	sub, _ := p.subscribe() // cannot fail before run
	defer p.unsubscribe(sub)
	s.procs.add(p)
	// What the process did may change what a login shell reads as it
	// starts; the next command, sent once the end event arrives, must find
	// the ready shell's replacement already starting.
	go p.run(c, s.procs, func() { s.shells.ended(spec) })
	s.log.Info("process started", "pid", p.pid, "cmd", cfg.GetCmd(), "args", logArgs(cfg.GetArgs()), "user", u.Name, "pty", spec.pty != nil, "ready_shell", ready)
	// The node reads these two lines into the sandbox's log.
	go func() {
		<-p.done
		p.mu.Lock()
		end := p.end
		p.mu.Unlock()
		s.log.Info("process ended", "pid", p.pid, "exit_code", end.GetExitCode(), "status", end.GetStatus())
	}()

	if deadline, ok := ctx.Deadline(); ok {
		go s.killAt(p, deadline)
	}

	start := &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}
	if err := stream.Send(&process.StartResponse{Event: start}); err != nil {
		return err
	}
	return forwardEvents(ctx, req.Header(), sub, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.StartResponse{Event: ev})
	})
}

// logArgs is a command's arguments for the log, cut short.
func logArgs(args []string) string {
	s := strings.Join(args, " ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}

// killAt kills p at deadline unless it has ended by then.
func (s *Server) killAt(p *proc, deadline time.Time) {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		s.log.Info("process timed out, killing it", "pid", p.pid)
		if err := p.signal(syscall.SIGKILL); err != nil {
			s.log.Debug("killing timed-out process", "pid", p.pid, "err", err)
		}
	}
}

func clampU16(v uint32, def uint16) uint16 {
	switch {
	case v == 0:
		return def
	case v > 0xffff:
		return 0xffff
	default:
		return uint16(v)
	}
}

// shellFallback runs /bin/bash commands with /bin/sh in images that have
// no bash (busybox, alpine): the SDKs start every command as
// `/bin/bash -l -c`, and a POSIX shell takes those flags too. argv[0]
// changes as well, since busybox picks its applet by that name.
func shellFallback(cmd string) string {
	if cmd == "/bin/bash" && executable(cmd) != nil && executable("/bin/sh") == nil {
		return "/bin/sh"
	}
	return cmd
}
