package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// serveEdit is what aenv's runsc build lists (`runsc aenv-edits`) when it
// has `runsc aenv-serve` (scripts/runsc-main/serve.go).
const serveEdit = "serve"

// Names in the driver's state directory.
const (
	serveSocketName = "runsc-serve.sock"
	serveLogName    = "runsc-serve.log"
)

// serveRetry is how long the driver runs runsc's commands itself after
// the server failed to start, before it starts one again.
const serveRetry = 10 * time.Second

// serveStopTimeout bounds how long close waits for the server to finish
// what it was serving once told to end.
const serveStopTimeout = 30 * time.Second

// serveRequest and serveReply are scripts/runsc-main/serve.go's: one of
// each per connection, as JSON.
type serveRequest struct {
	Op           string   `json:"op"`
	Root         string   `json:"root"`
	ID           string   `json:"id"`
	ImagePath    string   `json:"imagePath,omitempty"`
	LeaveRunning bool     `json:"leaveRunning,omitempty"`
	Flags        []string `json:"flags,omitempty"`
}

type serveReply struct {
	Err string `json:"err,omitempty"`
}

// runscServer is a long-lived `runsc aenv-serve`: it restores checkpoints
// into created containers, checkpoints containers and deletes them, each
// as the runsc command would, without starting the 100 MB runsc binary
// for it (~21 CPU-ms and ~1,000 page faults here before the command does
// anything; on the critical path of every resume, pause and fork and of
// each fork child, and one per kill). It is started on first use, again
// after it ends, and again once runsc is replaced (an upgrade); while it
// cannot start, the driver runs the commands itself.
type runscServer struct {
	path string
	// args are runsc's global flags, the driver's for every command.
	args []string
	dir  string
	log  *slog.Logger

	mu sync.Mutex
	// alive is the write end of the pipe the server reads for the
	// driver's end; nil while no server runs.
	alive *os.File
	// proc is the server's process, and exited is closed once it has
	// ended.
	proc   *os.Process
	exited chan struct{}
	// bin is the identity of the binary proc was started from.
	bin binaryID
	// closed is set by close: no server starts after it.
	closed bool
	// failedAt is when a start last failed.
	failedAt time.Time

	// answered counts the requests the server answered.
	answered atomic.Int64
}

func newRunscServer(path string, args []string, dir string, log *slog.Logger) *runscServer {
	return &runscServer{path: path, args: args, dir: dir, log: log}
}

// withAddr calls fn with the socket's address: its path, or where that
// does not fit in a unix address (a test's state directory), a path
// through a descriptor of its directory, held only while fn runs. (A
// descriptor number kept longer would name whatever file reuses it once
// anything closes it.)
func (s *runscServer) withAddr(fn func(addr string) error) error {
	p := filepath.Join(s.dir, serveSocketName)
	if len(p) < unixPathMax {
		return fn(p)
	}
	fd, err := unix.Open(s.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return fn(fmt.Sprintf("/proc/self/fd/%d/%s", fd, serveSocketName))
}

// running makes sure that a server runs, starting one if none does.
func (s *runscServer) running() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alive != nil {
		select {
		case <-s.exited:
		default:
			// An upgrade replaces runsc under a running aenv server: the
			// commands it still starts run the new binary, so its server
			// must too (a restore by one build of a container another
			// created is not promised to work). The old one finishes what
			// it serves and ends; the new one takes the socket's name.
			id, err := statBinary(s.path)
			if err != nil || id == s.bin {
				return nil
			}
			s.log.Info("runsc was replaced: starting its server again", "path", s.path, "old_pid", s.proc.Pid)
		}
		s.alive.Close()
		s.alive = nil
	}
	if s.closed {
		return errors.New("the driver is closed")
	}
	if time.Since(s.failedAt) < serveRetry {
		return errors.New("the runsc server failed to start a moment ago")
	}
	if err := s.start(); err != nil {
		s.failedAt = time.Now()
		s.log.Warn("runsc's commands run one process each: the runsc server did not start", "err", err)
		return err
	}
	return nil
}

// start starts a server; s.mu is held.
func (s *runscServer) start() error {
	// Read before the start: a binary replaced in between is noticed at
	// the next request, and its server started again.
	bin, err := statBinary(s.path)
	if err != nil {
		return fmt.Errorf("starting the runsc server: %w", err)
	}
	var l *net.UnixListener
	err = s.withAddr(func(addr string) error {
		if err := os.Remove(addr); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		var err error
		l, err = net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
		return err
	})
	if err != nil {
		return fmt.Errorf("starting the runsc server: %w", err)
	}
	// The server's copy serves; ours goes, and must leave the name.
	l.SetUnlinkOnClose(false)
	defer l.Close()
	lf, err := l.File()
	if err != nil {
		return fmt.Errorf("starting the runsc server: %w", err)
	}
	defer lf.Close()
	parentR, parentW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("starting the runsc server: %w", err)
	}
	defer parentR.Close()
	logFile, err := os.OpenFile(filepath.Join(s.dir, serveLogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		parentW.Close()
		return fmt.Errorf("starting the runsc server: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(s.path, append([]string{"aenv-serve"}, s.args...)...)
	// Descriptors 3 and 4, as serve.go expects them.
	cmd.ExtraFiles = []*os.File{lf, parentR}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Not in our process group: a Ctrl-C on the server must not end it
	// half-way through a restore.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		parentW.Close()
		return fmt.Errorf("starting the runsc server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		err := cmd.Wait()
		close(exited)
		s.mu.Lock()
		ours := s.exited == exited && s.alive != nil
		s.mu.Unlock()
		if ours {
			s.log.Warn("the runsc server ended", "pid", cmd.Process.Pid, "err", err, "log", filepath.Join(s.dir, serveLogName))
		}
	}()
	s.alive, s.exited, s.proc, s.bin = parentW, exited, cmd.Process, bin
	s.log.Debug("runsc server started", "pid", cmd.Process.Pid)
	return nil
}

// binaryID tells one file at a path from another put there later, or
// from itself rewritten in place.
type binaryID struct {
	dev, ino uint64
	size     int64
	mtime    unix.Timespec
}

func statBinary(path string) (binaryID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return binaryID{}, fmt.Errorf("stat %s: %w", path, err)
	}
	return binaryID{dev: st.Dev, ino: st.Ino, size: st.Size, mtime: st.Mtim}, nil
}

// errNoAnswer is a request the runsc server took and ended without
// answering: it may have acted on it, in part.
var errNoAnswer = errors.New("the runsc server did not answer")

// call sends req and waits for its reply, however long the command takes
// (a restore or delete must not be left half-way because its caller gave
// up). An error that wraps errNotSent is one the server never acted on.
func (s *runscServer) call(req serveRequest) error {
	conn, err := s.dial()
	if err != nil {
		return fmt.Errorf("%w: %w", errNotSent, err)
	}
	defer conn.Close()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		// The server acts on a whole request only.
		return fmt.Errorf("%w: sending %s of %s to the runsc server: %w", errNotSent, req.Op, req.ID, err)
	}
	var rep serveReply
	if err := json.NewDecoder(conn).Decode(&rep); err != nil {
		return fmt.Errorf("%s of %s: %w: %w", req.Op, req.ID, errNoAnswer, err)
	}
	s.answered.Add(1)
	if rep.Err != "" {
		return fmt.Errorf("%s of %s: %s", req.Op, req.ID, rep.Err)
	}
	return nil
}

// dial connects to the server, starting it if it does not run; once
// more if the one it found has just ended.
func (s *runscServer) dial() (net.Conn, error) {
	var err error
	for range 2 {
		if err = s.running(); err != nil {
			return nil, err
		}
		var conn net.Conn
		err = s.withAddr(func(addr string) error {
			var err error
			conn, err = net.Dial("unix", addr)
			return err
		})
		if err == nil {
			return conn, nil
		}
		s.mu.Lock()
		exited := s.exited
		s.mu.Unlock()
		select {
		case <-exited:
		case <-time.After(time.Second):
			// Running but refusing: the caller runs the command itself.
			return nil, fmt.Errorf("connecting to the runsc server: %w", err)
		}
	}
	// Two servers ended at once: the next waits for serveRetry.
	s.mu.Lock()
	s.failedAt = time.Now()
	s.mu.Unlock()
	s.log.Warn("runsc's commands run one process each for a while: the runsc server ends as it starts", "log", filepath.Join(s.dir, serveLogName))
	return nil, fmt.Errorf("connecting to the runsc server: %w", err)
}

// close tells the server to end, waits at most serveStopTimeout for it
// to finish what it serves, and kills it if it has not. No server starts
// after it.
func (s *runscServer) close() {
	s.mu.Lock()
	alive, exited, proc := s.alive, s.exited, s.proc
	s.alive, s.closed = nil, true
	s.mu.Unlock()
	if alive == nil {
		return
	}
	alive.Close()
	select {
	case <-exited:
	case <-time.After(serveStopTimeout):
		s.log.Warn("the runsc server did not end in time: killing it", "pid", proc.Pid)
		proc.Kill()
		<-exited
	}
}

// served runs req through the driver's runsc server; an error wrapping
// errNotSent says that the caller should run the command itself (there
// is no server, or it never saw the request).
func (d *Driver) served(req serveRequest) error {
	if d.serve == nil {
		return errNotSent
	}
	req.Root = d.runc.Root
	return d.serve.call(req)
}
