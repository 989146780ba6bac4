package interpreter

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
)

// delimiter separates a Jupyter message's routing identities from its
// signed parts.
const delimiter = "<IDS|MSG>"

// header is a Jupyter message header.
type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is one Jupyter message, decoded as far as routing needs.
type message struct {
	Header       header          `json:"header"`
	ParentHeader header          `json:"parent_header"`
	Content      json.RawMessage `json:"content"`
}

// pythonKernel is one ipykernel process and the sockets it is spoken to
// through. Executions are serialised by the caller; the kernel itself runs
// one at a time.
type pythonKernel struct {
	log     *slog.Logger
	key     []byte
	session string
	cmd     *exec.Cmd
	exited  chan struct{}
	connDir string

	shell, iopub zmq4.Socket
	cancel       context.CancelFunc

	mu sync.Mutex
	// waiting routes iopub messages and shell replies by their parent's
	// msg_id.
	waiting map[string]*waiter
}

// kernelOptions say how to start a kernel.
type kernelOptions struct {
	// Python is the interpreter (with ipykernel importable).
	Python string
	Cwd    string
	Env    []string
	// Cred, when set, runs the kernel as another user.
	Cred *syscall.Credential
	// Startup is Python run silently once the kernel is up.
	Startup string
}

// freePorts asks the kernel for n unused local TCP ports. Another process
// could take one before the kernel binds it; the kernel then fails to
// start and the caller sees the error.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func newToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// startPythonKernel launches ipykernel with a connection file of our own
// and waits until it answers on shell and publishes on iopub.
func startPythonKernel(ctx context.Context, log *slog.Logger, opts kernelOptions) (_ *pythonKernel, err error) {
	ports, err := freePorts(5)
	if err != nil {
		return nil, fmt.Errorf("starting kernel: %w", err)
	}
	k := &pythonKernel{log: log, key: []byte(newToken()), session: newToken(), exited: make(chan struct{}),
		waiting: map[string]*waiter{}}
	k.connDir, err = os.MkdirTemp("", "aenv-kernel-")
	if err != nil {
		return nil, fmt.Errorf("starting kernel: %w", err)
	}
	defer func() {
		if err != nil {
			k.close()
		}
	}()
	conn := map[string]any{
		"shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2], "control_port": ports[3], "hb_port": ports[4],
		"ip": "127.0.0.1", "key": string(k.key), "transport": "tcp", "signature_scheme": "hmac-sha256", "kernel_name": "python3",
	}
	b, _ := json.Marshal(conn)
	connFile := filepath.Join(k.connDir, "kernel.json")
	if err := os.WriteFile(connFile, b, 0o600); err != nil {
		return nil, fmt.Errorf("starting kernel: %w", err)
	}
	if opts.Cred != nil {
		os.Chown(k.connDir, int(opts.Cred.Uid), int(opts.Cred.Gid))
		os.Chown(connFile, int(opts.Cred.Uid), int(opts.Cred.Gid))
	}
	k.cmd = exec.Command(opts.Python, "-m", "ipykernel_launcher", "-f", connFile)
	k.cmd.Dir, k.cmd.Env = opts.Cwd, opts.Env
	// Its own process group, so that an interrupt or a kill reaches what
	// the user's code started too, and no signal of ours reaches it by
	// accident.
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: opts.Cred}
	logw := &lineLogger{log: log.With("kernel", "python")}
	k.cmd.Stdout, k.cmd.Stderr = logw, logw
	// A process the user's code started outside the kernel's group may
	// hold its output open: Wait must not wait for it.
	k.cmd.WaitDelay = 2 * time.Second
	if err := k.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting kernel: %w", err)
	}
	go func() { k.cmd.Wait(); close(k.exited) }()

	sctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	addr := func(p int) string { return "tcp://127.0.0.1:" + strconv.Itoa(p) }
	if err := k.waitListening(ctx, ports[0]); err != nil {
		return nil, err
	}
	k.shell = zmq4.NewDealer(sctx, zmq4.WithID(zmq4.SocketIdentity(k.session)))
	if err := k.shell.Dial(addr(ports[0])); err != nil {
		return nil, fmt.Errorf("starting kernel: connecting to its shell: %w", err)
	}
	k.iopub = zmq4.NewSub(sctx)
	if err := k.iopub.Dial(addr(ports[1])); err != nil {
		return nil, fmt.Errorf("starting kernel: connecting to its iopub: %w", err)
	}
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return nil, fmt.Errorf("starting kernel: subscribing to its iopub: %w", err)
	}
	go k.read(k.shell, false)
	go k.read(k.iopub, true)
	if err := k.waitReady(ctx); err != nil {
		return nil, err
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

// waitListening waits for the kernel to bind its shell port: zmq4's
// dialer gives up on a refused connection rather than retrying, and a
// kernel takes a second or more to import itself.
func (k *pythonKernel) waitListening(ctx context.Context, port int) error {
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-k.exited:
			return fmt.Errorf("starting kernel: it exited (%v) before listening", k.cmd.ProcessState)
		case <-ctx.Done():
			return fmt.Errorf("starting kernel: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitReady asks for kernel_info until the reply and an iopub message for
// the same request both arrive: only then does a subscription see an
// execution's output from its first line.
func (k *pythonKernel) waitReady(ctx context.Context) error {
	for {
		id, ch, err := k.send("kernel_info_request", map[string]any{})
		if err != nil {
			return fmt.Errorf("starting kernel: %w", err)
		}
		gotReply, gotPub := false, false
		timer := time.NewTimer(500 * time.Millisecond)
	wait:
		for !gotReply || !gotPub {
			select {
			case m := <-ch:
				if m.Header.MsgType == "kernel_info_reply" {
					gotReply = true
				} else {
					gotPub = true
				}
			case <-timer.C:
				break wait
			case <-k.exited:
				timer.Stop()
				k.forget(id)
				return fmt.Errorf("starting kernel: it exited (%v)", k.cmd.ProcessState)
			case <-ctx.Done():
				timer.Stop()
				k.forget(id)
				return fmt.Errorf("starting kernel: %w", ctx.Err())
			}
		}
		timer.Stop()
		k.forget(id)
		if gotReply && gotPub {
			return nil
		}
	}
}

func (k *pythonKernel) sign(parts ...[]byte) []byte {
	h := hmac.New(sha256.New, k.key)
	for _, p := range parts {
		h.Write(p)
	}
	return []byte(hex.EncodeToString(h.Sum(nil)))
}

// send writes a shell request and registers for what answers it.
func (k *pythonKernel) send(msgType string, content any) (string, chan message, error) {
	h := header{MsgID: newToken(), Session: k.session, Username: "aenv", Date: time.Now().UTC().Format(time.RFC3339Nano),
		MsgType: msgType, Version: "5.3"}
	hb, _ := json.Marshal(h)
	cb, err := json.Marshal(content)
	if err != nil {
		return "", nil, err
	}
	parent, meta := []byte("{}"), []byte("{}")
	w := &waiter{ch: make(chan message, 64), gone: make(chan struct{})}
	ch := w.ch
	k.mu.Lock()
	k.waiting[h.MsgID] = w
	k.mu.Unlock()
	msg := zmq4.NewMsgFrom([]byte(delimiter), k.sign(hb, parent, meta, cb), hb, parent, meta, cb)
	if err := k.shell.Send(msg); err != nil {
		k.forget(h.MsgID)
		return "", nil, fmt.Errorf("sending %s: %w", msgType, err)
	}
	return h.MsgID, ch, nil
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
	k.mu.Unlock()
}

// read decodes messages from one socket and hands each to whoever waits
// for its parent. A message whose signature does not verify is dropped:
// something else on this host's loopback is talking to us.
func (k *pythonKernel) read(sock zmq4.Socket, pub bool) {
	for {
		raw, err := sock.Recv()
		if err != nil {
			return
		}
		frames := raw.Frames
		i := 0
		for i < len(frames) && string(frames[i]) != delimiter {
			i++
		}
		if len(frames) < i+6 {
			continue
		}
		sig, hb, pb, mb, cb := frames[i+1], frames[i+2], frames[i+3], frames[i+4], frames[i+5]
		if !hmac.Equal(sig, k.sign(hb, pb, mb, cb)) {
			k.log.Warn("dropping a kernel message with a bad signature")
			continue
		}
		var m message
		if json.Unmarshal(hb, &m.Header) != nil || json.Unmarshal(pb, &m.ParentHeader) != nil {
			continue
		}
		m.Content = cb
		k.mu.Lock()
		w := k.waiting[m.ParentHeader.MsgID]
		k.mu.Unlock()
		if w == nil {
			continue
		}
		// Never drop a message of a waiting request (its idle status
		// ends the execution): wait for a slow client instead. A request
		// forgotten meanwhile takes nothing more.
		select {
		case w.ch <- m:
		case <-w.gone:
		}
	}
}

// execute runs code and calls emit for each iopub message of it (by
// msg_type) and once for the execute_reply ("execute_reply"). It returns
// when the kernel is idle again, or with ctx's error after interrupting
// the kernel.
func (k *pythonKernel) execute(ctx context.Context, code string, silent bool, emit func(typ string, content json.RawMessage)) error {
	id, ch, err := k.send("execute_request", map[string]any{
		"code": code, "silent": silent, "store_history": !silent, "user_expressions": map[string]any{},
		// Executions are sent one at a time; stop_on_error would only
		// make the kernel abort the next one if it came in quickly after
		// a failure.
		"allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return err
	}
	defer k.forget(id)
	idle, replied := false, false
	interrupted := false
	done := ctx.Done()
	for !idle || !replied {
		select {
		case m := <-ch:
			switch m.Header.MsgType {
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
// the running code (ipykernel's default interrupt mode is a signal).
func (k *pythonKernel) interrupt() {
	if k.cmd.Process != nil {
		syscall.Kill(k.cmd.Process.Pid, syscall.SIGINT)
	}
}

// close kills the kernel and everything it started.
func (k *pythonKernel) close() {
	if k.cancel != nil {
		k.cancel()
	}
	if k.shell != nil {
		k.shell.Close()
	}
	if k.iopub != nil {
		k.iopub.Close()
	}
	if k.cmd != nil && k.cmd.Process != nil {
		syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.exited
	}
	if k.connDir != "" {
		os.RemoveAll(k.connDir)
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
