package gvisor

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/runtime"
)

// envd's stdout and stderr reach the host through a FIFO in the
// sandbox's directory, which a goroutine of the driver copies into a log
// file of at most envdLogMax bytes, with one rotated file beside it. A
// plain file would grow without bound: root inside the sandbox can write
// to it through /proc/1/fd/1.
//
// The sandbox holds the FIFO open read-write, so it never has no reader
// and a write never fails (nor raises SIGPIPE, which would kill envd)
// while no process of ours reads it: a restarted driver opens the FIFO
// again (Recover) and carries on where the last one stopped. Meanwhile
// the pipe's buffer (pipeBuffer) takes envd's lines; were it to fill, envd
// would wait for the next reader.
const (
	envdLogName  = "envd.log"
	envdPipeName = "envd.pipe"
	// envdLogMax bounds envd.log; envd.log.1 holds the part before.
	envdLogMax = 8 << 20
	// pipeBuffer is what the FIFO holds while nothing reads it (Linux's
	// default bound for an unprivileged F_SETPIPE_SZ).
	pipeBuffer = 1 << 20
	// maxLogLine is the longest line copied whole: a longer one (garbage
	// written through /proc/1/fd/1) is cut into lines of this size.
	maxLogLine = 64 << 10
	// pumpDrainTimeout is how long Kill waits for envd's last lines.
	pumpDrainTimeout = 2 * time.Second
	// pumpCatchUp bounds how long EnvdLog waits for the pump to copy what
	// envd has written (see logPump.caughtUp).
	pumpCatchUp = 250 * time.Millisecond
)

// logPump copies one sandbox's FIFO into its log file.
type logPump struct {
	r    *os.File
	done chan struct{}
	// taken counts the bytes read from the FIFO, handled those of them
	// copied into the log (or dropped): a line still in the pump's buffer
	// is taken, not handled.
	taken, handled atomic.Int64
	// serving is closed, by served, once envd logs that it serves or
	// the pump ends (see EnvdServing).
	serving chan struct{}
	served  func()
}

// servingLine is what a line of envd's log (slog's text format) holds
// from its level on when envd says it serves. Matched with the level, a
// quoted value elsewhere in a line (a command's arguments) cannot pass
// for it: slog escapes the quotes inside one.
var servingLine = []byte(" level=INFO msg=" + strconv.Quote(runtime.EnvdServingMessage) + " ")

// makeEnvdPipe makes the FIFO in dir and returns the end the sandbox
// gets (read-write, blocking) and the driver's (read-only, non-blocking,
// so that closing it stops a read under way).
func makeEnvdPipe(dir string) (sandboxEnd *os.File, err error) {
	p := filepath.Join(dir, envdPipeName)
	if err := unix.Mkfifo(p, 0o600); err != nil {
		return nil, fmt.Errorf("making envd's pipe: %w", err)
	}
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening envd's pipe: %w", err)
	}
	// Best effort: the default 64 KiB is a few hundred of envd's lines.
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, pipeBuffer)
	return os.NewFile(uintptr(fd), p), nil
}

// startPump starts copying sandbox id's FIFO into its log; a sandbox
// without a FIFO (started before there were any) writes its log file
// itself. The pump ends when the sandbox does (no writer is left) or
// stopPump stops it.
func (d *Driver) startPump(id string) error {
	dir := d.sandboxDir(id)
	fd, err := unix.Open(filepath.Join(dir, envdPipeName), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opening envd's pipe of %s: %w", id, err)
	}
	w, err := openRotating(filepath.Join(dir, envdLogName), envdLogMax)
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("opening envd's log of %s: %w", id, err)
	}
	p := &logPump{r: os.NewFile(uintptr(fd), envdPipeName), done: make(chan struct{}), serving: make(chan struct{})}
	p.served = sync.OnceFunc(func() { close(p.serving) })
	d.mu.Lock()
	d.pumps[id] = p
	d.mu.Unlock()
	log := d.log.With("sandbox_id", id)
	go func() {
		defer close(p.done)
		defer p.served()
		copyLog(w, countingReader{p.r, &p.taken}, log, p.served, func(n int) { p.handled.Add(int64(n)) })
		p.r.Close()
		if err := w.Close(); err != nil {
			log.Warn("closing envd's log", "err", err)
		}
		d.mu.Lock()
		if d.pumps[id] == p {
			delete(d.pumps, id)
		}
		d.mu.Unlock()
	}()
	return nil
}

// pump is sandbox id's pump, nil when none runs.
func (d *Driver) pump(id string) *logPump {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pumps[id]
}

// stopPump waits up to wait for sandbox id's pump to copy what is left
// (its sandbox gone), then stops it.
func (d *Driver) stopPump(id string, wait time.Duration) {
	p := d.pump(id)
	if p == nil {
		return
	}
	select {
	case <-p.done:
		return
	case <-time.After(wait):
	}
	p.r.Close()
	<-p.done
}

// caughtUp reports whether the pump has copied all envd has written: the
// FIFO holds nothing (TIOCINQ, Linux's FIONREAD, on a pipe), and every
// byte read from it is in the log. A line envd has half written (no
// newline yet) keeps it false.
func (p *logPump) caughtUp() bool {
	rc, err := p.r.SyscallConn()
	if err != nil {
		return true // closed: nothing more will come
	}
	unread := 0
	var ioErr error
	if err := rc.Control(func(fd uintptr) { unread, ioErr = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil || ioErr != nil {
		return true
	}
	return unread == 0 && p.taken.Load() == p.handled.Load()
}

// catchUp waits, up to wait, for sandbox id's pump to copy what envd has
// written so far: a read of the log right after a command ends then holds
// the command's lines, though the pump may lag behind a flood of output
// (root inside writing to /proc/1/fd/1).
func (d *Driver) catchUp(id string, wait time.Duration) {
	p := d.pump(id)
	if p == nil {
		return
	}
	deadline := time.Now().Add(wait)
	for !p.caughtUp() && time.Now().Before(deadline) {
		select {
		case <-p.done:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// countingReader adds what it reads from r to n.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(int64(k))
	return k, err
}

// EnvdServing implements runtime.EnvdWatcher.
func (d *Driver) EnvdServing(id string) <-chan struct{} {
	if p := d.pump(id); p != nil {
		return p.serving
	}
	return nil
}

// copyLog copies r's lines into w until r ends, calling serving at each
// line in which envd says it serves, and handled with the bytes of r each
// line took once it is written. A line too long is cut (so that the log
// stays lines a reader can take one at a time), and what w refuses is
// dropped: envd must never wait on the host's disk.
func copyLog(w io.Writer, r io.Reader, log *slog.Logger, serving func(), handled func(int)) {
	br := bufio.NewReaderSize(r, maxLogLine)
	failed := false
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if bytes.Contains(line, servingLine) {
				serving()
			}
			n := len(line)
			if line[n-1] != '\n' {
				line = append(line, '\n')
			}
			if _, werr := w.Write(line); werr != nil && !failed {
				log.Warn("writing envd's log; its lines are dropped until it works again", "err", werr)
				failed = true
			} else if werr == nil {
				failed = false
			}
			handled(n)
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

// rotatingFile is a log file of at most max bytes: a write that would
// pass that moves it to path.1 (replacing the one before) and starts
// afresh. Written here rather than taken from a library: the common one
// names its rotated files by time and keeps a goroutine per file for
// ever, where a reader here wants one known name and a sandbox has a
// goroutine only while it runs.
type rotatingFile struct {
	path string
	max  int64
	f    *os.File
	size int64
}

func openRotating(path string, max int64) (*rotatingFile, error) {
	w := &rotatingFile{path: path, max: max}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *rotatingFile) open() error {
	f, err := os.OpenFile(w.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	w.f, w.size = f, fi.Size()
	return nil
}

// Write implements io.Writer.
func (w *rotatingFile) Write(p []byte) (int, error) {
	if w.f == nil || (w.size > 0 && w.size+int64(len(p)) > w.max) {
		if err := w.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := w.f.Write(p)
	w.size += int64(n)
	return n, err
}

// rotate starts a new file. The new one is made aside and swapped in
// (RENAME_EXCHANGE), so that the log's name never stands empty: a reader
// (the logs call) between the two steps of a plain rename would find no
// log at all.
func (w *rotatingFile) rotate() error {
	if w.f == nil {
		return w.open()
	}
	w.f.Close()
	w.f = nil
	fresh := w.path + ".new"
	f, err := os.OpenFile(fresh, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("rotating %s: %w", w.path, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, fresh, unix.AT_FDCWD, w.path, unix.RENAME_EXCHANGE); err != nil {
		f.Close()
		return fmt.Errorf("rotating %s: %w", w.path, err)
	}
	// fresh now names the old part.
	if err := os.Rename(fresh, w.path+".1"); err != nil {
		f.Close()
		return fmt.Errorf("rotating %s: %w", w.path, err)
	}
	w.f, w.size = f, 0
	return nil
}

// Close closes the file.
func (w *rotatingFile) Close() error {
	if w.f == nil {
		return nil
	}
	return w.f.Close()
}

// EnvdLog implements runtime.LogReader: the rotated part first, then the
// current file, once the pump has copied what envd wrote before the call
// (or pumpCatchUp has passed). The current one is opened first: a
// rotation in between then shows the same file twice, which is given once.
func (d *Driver) EnvdLog(id string) ([]*os.File, error) {
	d.catchUp(id, pumpCatchUp)
	p := filepath.Join(d.sandboxDir(id), envdLogName)
	cur, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("reading envd log of %s: %w", id, runtime.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("reading envd log of %s: %w", id, err)
	}
	old, err := os.Open(p + ".1")
	if err != nil {
		return []*os.File{cur}, nil
	}
	a, aerr := old.Stat()
	b, berr := cur.Stat()
	if aerr != nil || berr != nil || os.SameFile(a, b) {
		old.Close()
		return []*os.File{cur}, nil
	}
	return []*os.File{old, cur}, nil
}
