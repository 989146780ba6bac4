package envd

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

type outputKind int

const (
	outputStdout outputKind = iota
	outputStderr
	outputPty
)

// How long envd keeps forwarding output after a process exits while
// something else (a background grandchild) still holds its stdout open:
// until output pauses for outputIdleGrace, at most outputMaxGrace.
const (
	outputIdleGrace = 100 * time.Millisecond
	outputMaxGrace  = 2 * time.Second
)

// proc is a process envd started. Its output is fanned out to every
// subscriber (the Start stream and any Connect streams); output produced
// while nobody listens is discarded, so a process never blocks on a client
// that went away.
type proc struct {
	pid    uint32
	tag    *string
	config *process.ProcessConfig
	reaper *reaper

	inMu  sync.Mutex
	stdin *os.File // nil when there is none or it was closed
	pty   *os.File // pty master, nil without a pty

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	ended bool
	// end is how it ended, once done is closed.
	end *process.ProcessEvent_EndEvent

	done       chan struct{} // closed once the end event went out
	lastOutput atomic.Int64  // unix nanos when output was last forwarded
	forwarding atomic.Int32  // pumps busy handing output to subscribers
}

type subscriber struct {
	ch   chan *process.ProcessEvent
	gone chan struct{}
	once sync.Once
}

func (s *subscriber) send(ev *process.ProcessEvent) {
	select {
	case s.ch <- ev:
	case <-s.gone:
	}
}

func newProc(c *child, cfg *process.ProcessConfig, tag *string, r *reaper) *proc {
	return &proc{
		pid:    uint32(c.pid),
		tag:    tag,
		config: cfg,
		reaper: r,
		stdin:  c.stdin,
		pty:    c.pty,
		subs:   map[*subscriber]struct{}{},
		done:   make(chan struct{}),
	}
}

// subscribe registers a listener for further output and the end event.
func (p *proc) subscribe() (*subscriber, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil, fmt.Errorf("connecting to process %d: %w", p.pid, errProcessExited)
	}
	s := &subscriber{ch: make(chan *process.ProcessEvent, 64), gone: make(chan struct{})}
	p.subs[s] = struct{}{}
	return s, nil
}

func (p *proc) unsubscribe(s *subscriber) {
	s.once.Do(func() { close(s.gone) })
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

func (p *proc) subscribers() []*subscriber {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return nil
	}
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	return subs
}

// run pumps the output and waits for the exit status, then removes the
// process from the table and sends the end event. Subscribers must have
// been registered before run starts if they are to see all output.
// exited, if set, is called as soon as the process has exited, before the
// end event goes out.
func (p *proc) run(c *child, table *procTable, exited func()) {
	var wg sync.WaitGroup
	for _, o := range c.outputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.pump(o)
		}()
	}
	readersDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(readersDone)
	}()

	ws := <-c.status
	if exited != nil {
		exited()
	}
	p.awaitOutput(readersDone)

	table.remove(p)
	end := endEvent(ws)
	p.mu.Lock()
	p.ended = true
	p.end = end
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	ev := &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
	for _, s := range subs {
		s.send(ev)
	}
	close(p.done)

	p.inMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	if p.pty != nil {
		// Hangs up the terminal: leftover jobs of the session get SIGHUP,
		// as when a terminal window closes.
		p.pty.Close()
		p.pty = nil
	}
	p.inMu.Unlock()
}

// awaitOutput waits until all output has been read after the exit, or,
// when a leftover descendant keeps the pipes open, until output pauses.
func (p *proc) awaitOutput(readersDone <-chan struct{}) {
	deadline := time.Now().Add(outputMaxGrace)
	tick := time.NewTicker(outputIdleGrace / 2)
	defer tick.Stop()
	for {
		select {
		case <-readersDone:
			return
		case now := <-tick.C:
			if p.forwarding.Load() > 0 {
				continue // a slow client must not lose the process's output
			}
			idle := now.Sub(time.Unix(0, p.lastOutput.Load()))
			if idle >= outputIdleGrace || now.After(deadline) {
				return
			}
		}
	}
}

// pump forwards one output until EOF. It keeps reading after the end event
// (discarding) so that a leftover writer never blocks on a full pipe.
func (p *proc) pump(o output) {
	defer func() {
		if o.kind != outputPty { // the master is closed by run
			o.f.Close()
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			p.forwarding.Add(1)
			data := slices.Clone(buf[:n])
			de := &process.ProcessEvent_DataEvent{}
			switch o.kind {
			case outputStdout:
				de.Output = &process.ProcessEvent_DataEvent_Stdout{Stdout: data}
			case outputStderr:
				de.Output = &process.ProcessEvent_DataEvent_Stderr{Stderr: data}
			case outputPty:
				de.Output = &process.ProcessEvent_DataEvent_Pty{Pty: data}
			}
			ev := &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: de}}
			for _, s := range p.subscribers() {
				s.send(ev)
			}
			p.lastOutput.Store(time.Now().UnixNano())
			p.forwarding.Add(-1)
		}
		if err != nil {
			return // EOF, or EIO once the last pty slave closed
		}
	}
}

// endEvent describes an exit the way E2B's envd does (Go's ProcessState
// wording): "exit status N" or "signal: killed", error set unless the
// process exited with 0, exit code -1 when killed by a signal.
func endEvent(ws syscall.WaitStatus) *process.ProcessEvent_EndEvent {
	switch {
	case ws.Exited():
		status := fmt.Sprintf("exit status %d", ws.ExitStatus())
		ev := &process.ProcessEvent_EndEvent{ExitCode: int32(ws.ExitStatus()), Exited: true, Status: status}
		if ws.ExitStatus() != 0 {
			ev.Error = &status
		}
		return ev
	case ws.Signaled():
		status := "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			status += " (core dumped)"
		}
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: status, Error: &status}
	default:
		status := fmt.Sprintf("unknown wait status %#x", uint32(ws))
		return &process.ProcessEvent_EndEvent{ExitCode: -1, Status: status, Error: &status}
	}
}

// writeInput sends input to the process: to its pty when it has one, else
// to its stdin pipe.
func (p *proc) writeInput(data []byte) error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	w := p.pty
	if w == nil {
		w = p.stdin
	}
	if w == nil {
		select {
		case <-p.done:
			return fmt.Errorf("writing to process %d: %w", p.pid, errProcessExited)
		default:
		}
		return fmt.Errorf("writing to process %d: %w: stdin is closed or was not requested (start with stdin: true)", p.pid, errInvalid)
	}
	if _, err := w.Write(data); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
			return fmt.Errorf("writing to process %d: %w", p.pid, errProcessExited)
		}
		return fmt.Errorf("writing to process %d: %w", p.pid, err)
	}
	return nil
}

// closeStdin makes the process read EOF.
func (p *proc) closeStdin() error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.pty != nil {
		return fmt.Errorf("closing stdin of process %d: %w: it has a pty; send Ctrl+D (0x04) instead", p.pid, errInvalid)
	}
	if p.stdin == nil {
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	if err != nil {
		return fmt.Errorf("closing stdin of process %d: %w", p.pid, err)
	}
	return nil
}

func (p *proc) resize(size ptySize) error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.pty == nil {
		return fmt.Errorf("resizing process %d: %w: it has no pty", p.pid, errInvalid)
	}
	return resizePty(p.pty, size)
}

// signal delivers sig to the process's group, so that a kill reaches the
// whole job the command started.
func (p *proc) signal(sig syscall.Signal) error {
	if err := p.reaper.signal(int(p.pid), sig, true); err != nil {
		return fmt.Errorf("signalling process %d: %w", p.pid, err)
	}
	return nil
}

// procTable indexes the running processes.
type procTable struct {
	mu    sync.Mutex
	byPid map[uint32]*proc
}

func newProcTable() *procTable { return &procTable{byPid: map[uint32]*proc{}} }

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byPid[p.pid] = p
}

func (t *procTable) remove(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byPid[p.pid] == p {
		delete(t.byPid, p.pid)
	}
}

func (t *procTable) list() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := make([]*proc, 0, len(t.byPid))
	for _, p := range t.byPid {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *proc) int { return int(a.pid) - int(b.pid) })
	return ps
}

// find resolves a selector (pid or tag) to a running process.
func (t *procTable) find(sel *process.ProcessSelector) (*proc, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *process.ProcessSelector_Pid:
		if p, ok := t.byPid[s.Pid]; ok {
			return p, nil
		}
		return nil, fmt.Errorf("finding process %d: %w", s.Pid, errNotFound)
	case *process.ProcessSelector_Tag:
		for _, p := range t.byPid {
			if p.tag != nil && *p.tag == s.Tag {
				return p, nil
			}
		}
		return nil, fmt.Errorf("finding process tagged %q: %w", s.Tag, errNotFound)
	default:
		return nil, fmt.Errorf("finding process: %w: no pid or tag given", errInvalid)
	}
}
