package interpreter

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// driverSource is the Python program a kernel runs: IPython's shell,
// driven over two pipes. See startPythonKernel for why not ipykernel.
//
//go:embed driver.py
var driverSource string

// message is one event of the driver: Header.MsgType is its kind (the
// Jupyter message types an execution publishes: stream, display_data,
// execute_result, error, execute_reply, status), ParentHeader.MsgID the
// request it belongs to.
type message struct {
	Header       header
	ParentHeader header
	Content      json.RawMessage
}

// header holds the one field of a Jupyter header that routing needs.
type header struct{ MsgID, MsgType string }

// pythonKernel is one Python process running IPython's shell for one
// context. Executions are serialised by the caller; the shell runs one at
// a time.
type pythonKernel struct {
	log    *slog.Logger
	cmd    *exec.Cmd
	exited chan struct{}
	ready  chan struct{}
	// requests is the driver's request pipe (its fd 3).
	requests *os.File

	mu sync.Mutex
	// waiting routes events by the request they belong to; current is
	// the execution in progress, which output written straight to the
	// process's stdout and stderr (by programs it started) goes to.
	waiting map[string]*waiter
	current string
}

// kernelOptions say how to start a kernel.
type kernelOptions struct {
	// Python is the interpreter (with IPython importable).
	Python string
	Cwd    string
	Env    []string
	// Cred, when set, runs the kernel as another user.
	Cred *syscall.Credential
	// Startup is Python run silently once the kernel is up.
	Startup string
}

func newToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startPythonKernel starts the driver and waits until its shell is up.
//
// Not ipykernel: a Jupyter kernel passes every execution through its
// shell, control and IOPub threads and ZeroMQ sockets, and under gVisor
// each hop between threads costs milliseconds. Measured in a sandbox on
// the 2-CPU test host: 37 ms per execute_request of '1+1' (a
// jupyter_client in the same sandbox), against 1.4 ms for IPython's
// run_cell and 0.14 ms for a pipe round trip. The driver keeps what users
// see of IPython (its display system, the last expression's result,
// magics, plain tracebacks, matplotlib inline) and publishes it in the
// Jupyter message types the rest of this package reads.
func startPythonKernel(ctx context.Context, log *slog.Logger, opts kernelOptions) (_ *pythonKernel, err error) {
	k := &pythonKernel{log: log, exited: make(chan struct{}), ready: make(chan struct{}), waiting: map[string]*waiter{}}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting kernel: %w", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, fmt.Errorf("starting kernel: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		for _, f := range []*os.File{reqR, reqW, evR, evW} {
			f.Close()
		}
		return nil, fmt.Errorf("starting kernel: %w", err)
	}
	k.requests = reqW
	k.cmd = exec.Command(opts.Python, "-c", driverSource)
	k.cmd.Dir, k.cmd.Env = opts.Cwd, opts.Env
	// Its own process group, so that an interrupt or a kill reaches what
	// the user's code started too, and no signal of ours reaches it by
	// accident.
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: opts.Cred}
	// Programs the code starts write to the process's own stdout and
	// stderr: that output goes to the execution, as Jupyter's does.
	k.cmd.Stdout, k.cmd.Stderr = outW, outW
	k.cmd.ExtraFiles = []*os.File{reqR, evW}
	// A process the user's code started outside the kernel's group may
	// hold its output open: Wait must not wait for it.
	k.cmd.WaitDelay = 2 * time.Second
	err = k.cmd.Start()
	// The child has its own copies (or none, if it did not start).
	reqR.Close()
	evW.Close()
	outW.Close()
	if err != nil {
		reqW.Close()
		evR.Close()
		outR.Close()
		return nil, fmt.Errorf("starting kernel: %w", err)
	}
	go func() { k.cmd.Wait(); close(k.exited) }()
	defer func() {
		if err != nil {
			k.close()
		}
	}()
	go k.readEvents(evR)
	go k.readOutput(outR)
	select {
	case <-k.ready:
	case <-k.exited:
		return nil, fmt.Errorf("starting kernel: it exited (%v) before its shell was up", k.cmd.ProcessState)
	case <-ctx.Done():
		return nil, fmt.Errorf("starting kernel: %w", ctx.Err())
	}
	if opts.Startup != "" {
		var failure error
		if err := k.execute(ctx, opts.Startup, true, func(typ string, content json.RawMessage) {
			if typ == "error" {
				failure = fmt.Errorf("kernel start-up code failed: %s", content)
			}
		}); err != nil {
			return nil, err
		}
		if failure != nil {
			return nil, failure
		}
	}
	return k, nil
}

// send asks the driver to run code and registers for its events.
func (k *pythonKernel) send(code string, silent bool) (string, chan message, error) {
	id := newToken()
	req, err := json.Marshal(map[string]any{"id": id, "code": code, "silent": silent})
	if err != nil {
		return "", nil, err
	}
	w := &waiter{ch: make(chan message, 64), gone: make(chan struct{})}
	k.mu.Lock()
	k.waiting[id], k.current = w, id
	k.mu.Unlock()
	if _, err := k.requests.Write(append(req, '\n')); err != nil {
		k.forget(id)
		return "", nil, fmt.Errorf("sending code to the kernel: %w", err)
	}
	return id, w.ch, nil
}

// waiter is whoever waits for the messages of one request.
type waiter struct {
	ch   chan message
	gone chan struct{} // closed by forget
}

func (k *pythonKernel) forget(id string) {
	k.mu.Lock()
	if w := k.waiting[id]; w != nil {
		close(w.gone)
		delete(k.waiting, id)
	}
	if k.current == id {
		k.current = ""
	}
	k.mu.Unlock()
}

// deliver hands m to whoever waits for request id. It never drops a
// message of a waiting request (its idle status ends the execution): it
// waits for a slow client instead. A request forgotten meanwhile takes
// nothing more.
func (k *pythonKernel) deliver(id string, m message) bool {
	k.mu.Lock()
	w := k.waiting[id]
	k.mu.Unlock()
	if w == nil {
		return false
	}
	select {
	case w.ch <- m:
	case <-w.gone:
	}
	return true
}

// readEvents decodes the driver's events, one JSON object a line.
func (k *pythonKernel) readEvents(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	// A display bundle (a PNG, base64) can be megabytes on one line.
	sc.Buffer(make([]byte, 0, 64<<10), 256<<20)
	for sc.Scan() {
		var ev struct {
			ID      string          `json:"id"`
			Type    string          `json:"type"`
			Content json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			k.log.Warn("undecodable event from the kernel", "err", err)
			continue
		}
		if ev.Type == "ready" {
			close(k.ready)
			continue
		}
		k.deliver(ev.ID, message{Header: header{MsgType: ev.Type}, ParentHeader: header{MsgID: ev.ID}, Content: ev.Content})
	}
	if err := sc.Err(); err != nil {
		k.log.Warn("reading the kernel's events", "err", err)
	}
}

// syncMarker opens and closes the marker the driver writes to its stdout
// after each execution (driver.py): what came before it in the pipe was
// written during the execution.
const syncMarker = "\x00\x00aenv-sync\x00"

// outputSynced is the message readOutput sends an execution once its
// marker has passed; outputSyncWait bounds the wait for it.
const (
	outputSynced   = "aenv_output_synced"
	outputSyncWait = 200 * time.Millisecond
)

// readOutput passes what was written to the process's stdout and stderr
// (by programs the code started; Python's own sys.stdout and sys.stderr
// go through the events, in order with the rest) to the execution in
// progress as stdout, and logs what comes between executions.
func (k *pythonKernel) readOutput(r io.ReadCloser) {
	defer r.Close()
	logw := &lineLogger{log: k.log.With("kernel", "python")}
	out := func(b []byte) {
		if len(b) == 0 {
			return
		}
		k.mu.Lock()
		id := k.current
		k.mu.Unlock()
		content, _ := json.Marshal(map[string]string{"name": "stdout", "text": string(b)})
		if id == "" || !k.deliver(id, message{Header: header{MsgType: "stream"}, ParentHeader: header{MsgID: id}, Content: content}) {
			logw.Write(b)
		}
	}
	var pending []byte
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.Index(pending, []byte(syncMarker))
			if i < 0 {
				break
			}
			j := bytes.Index(pending[i+len(syncMarker):], []byte(syncMarker))
			if j < 0 {
				break
			}
			out(pending[:i])
			id := string(pending[i+len(syncMarker) : i+len(syncMarker)+j])
			k.deliver(id, message{Header: header{MsgType: outputSynced}, ParentHeader: header{MsgID: id}})
			pending = pending[i+2*len(syncMarker)+j:]
		}
		// Keep back what may be the start of a marker (it is shorter
		// than the window).
		keep := 0
		tail := max(0, len(pending)-(2*len(syncMarker)+64))
		if i := bytes.IndexByte(pending[tail:], 0); i >= 0 {
			keep = len(pending) - tail - i
		}
		out(pending[:len(pending)-keep])
		pending = pending[len(pending)-keep:]
		if err != nil {
			out(pending)
			return
		}
	}
}

// execute runs code and calls emit for each iopub message of it (by
// msg_type) and once for the execute_reply ("execute_reply"). It returns
// when the kernel is idle again, or with ctx's error after interrupting
// the kernel.
func (k *pythonKernel) execute(ctx context.Context, code string, silent bool, emit func(typ string, content json.RawMessage)) error {
	id, ch, err := k.send(code, silent)
	if err != nil {
		return err
	}
	defer k.forget(id)
	idle, replied, synced := false, false, false
	interrupted := false
	done := ctx.Done()
	// Once the driver is idle, what programs wrote to its stdout before
	// it (their marker behind it) may still be in the pipe: waited for,
	// briefly, as code may have closed or moved its stdout.
	var syncWait <-chan time.Time
	for !idle || !replied || !synced {
		if idle && replied && syncWait == nil {
			syncWait = time.After(outputSyncWait)
		}
		select {
		case <-syncWait:
			synced = true
		case m := <-ch:
			switch m.Header.MsgType {
			case outputSynced:
				synced = true
			case "status":
				var st struct {
					ExecutionState string `json:"execution_state"`
				}
				json.Unmarshal(m.Content, &st)
				idle = st.ExecutionState == "idle"
			case "execute_reply":
				replied = true
				emit("execute_reply", m.Content)
			default:
				emit(m.Header.MsgType, m.Content)
			}
		case <-done:
			// The caller gave up (its timeout, or it went away): stop the
			// code so that the context is usable again, then wait for the
			// kernel to say it is idle.
			interrupted = true
			done = nil
			k.interrupt()
		case <-k.exited:
			return fmt.Errorf("the kernel died while running the code (%v)", k.cmd.ProcessState)
		case <-time.After(30 * time.Second):
			if interrupted {
				// Replaced before the next execution.
				return fmt.Errorf("%w: it did not stop within 30 s of an interrupt", errKernelDied)
			}
		}
	}
	if interrupted {
		return ctx.Err()
	}
	return nil
}

// interrupt sends SIGINT to the kernel, which raises KeyboardInterrupt in
// the running code (driver.py).
func (k *pythonKernel) interrupt() {
	if k.cmd.Process != nil {
		syscall.Kill(k.cmd.Process.Pid, syscall.SIGINT)
	}
}

// close kills the kernel and everything it started.
func (k *pythonKernel) close() {
	if k.cmd != nil && k.cmd.Process != nil {
		syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.exited
	}
	if k.requests != nil {
		k.requests.Close()
	}
}

// lineLogger logs a process's output line by line.
type lineLogger struct {
	log *slog.Logger
	mu  sync.Mutex
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.log.Debug(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	if len(l.buf) > 64<<10 {
		l.log.Debug(string(l.buf))
		l.buf = l.buf[:0]
	}
	return len(p), nil
}
