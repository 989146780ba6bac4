package envd

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// spawn forks and execs spec through the reaper. Child-side descriptors are
// closed in the parent before it returns.
func (s *Server) spawn(spec spawnSpec) (*child, error) {
	path, err := lookPath(spec.argv[0], spec.env, spec.dir)
	if err != nil {
		return nil, err
	}
	sys := &syscall.SysProcAttr{}
	if spec.switchUser {
		sys.Credential = &syscall.Credential{Uid: spec.user.UID, Gid: spec.user.GID, Groups: spec.user.Groups}
	}

	c := &child{}
	var childFiles []*os.File // closed after fork
	defer func() {
		for _, f := range childFiles {
			f.Close()
		}
	}()
	fail := func(err error) (*child, error) {
		for _, f := range []*os.File{c.stdin, c.pty, c.script} {
			if f != nil {
				f.Close()
			}
		}
		for _, o := range c.outputs {
			o.f.Close()
		}
		return nil, err
	}

	var fds []uintptr
	if spec.pty != nil {
		master, tty, err := openPty()
		if err != nil {
			return nil, err
		}
		c.pty = master
		c.outputs = []output{{kind: outputPty, f: master}}
		childFiles = append(childFiles, tty)
		if err := resizePty(master, *spec.pty); err != nil {
			return fail(err)
		}
		if spec.switchUser {
			// Like login(1): the terminal belongs to the user on it.
			_ = os.Chown(tty.Name(), int(spec.user.UID), -1)
		}
		fd := tty.Fd()
		fds = []uintptr{fd, fd, fd}
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		var in *os.File
		if spec.stdin {
			w, r, err := childPipe(false)
			if err != nil {
				return fail(fmt.Errorf("creating stdin pipe: %w", err))
			}
			c.stdin, in = w, r
		} else {
			fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fail(fmt.Errorf("opening %s: %w", os.DevNull, err))
			}
			in = os.NewFile(uintptr(fd), os.DevNull)
		}
		childFiles = append(childFiles, in)
		fds = []uintptr{in.Fd()}
		for _, kind := range []outputKind{outputStdout, outputStderr} {
			r, w, err := childPipe(true)
			if err != nil {
				return fail(fmt.Errorf("creating output pipe: %w", err))
			}
			childFiles = append(childFiles, w)
			c.outputs = append(c.outputs, output{kind: kind, f: r})
			fds = append(fds, w.Fd())
		}
		if spec.script {
			w, r, err := childPipe(false)
			if err != nil {
				return fail(fmt.Errorf("creating script pipe: %w", err))
			}
			childFiles = append(childFiles, r)
			c.script = w
			fds = append(fds, r.Fd())
		}
		// Its own process group, so that a signal reaches the whole job.
		sys.Setpgid = true
	}

	attr := &syscall.ProcAttr{Dir: spec.dir, Env: spec.env, Files: fds, Sys: sys}
	pid, status, err := s.reaper.start(func() (int, error) {
		return syscall.ForkExec(path, spec.argv, attr)
	})
	runtime.KeepAlive(childFiles)
	if err != nil {
		return fail(fmt.Errorf("starting %s: %w", path, err))
	}
	c.pid, c.status = pid, status
	return c, nil
}

// childPipe returns a pipe's two ends: envd's, non-blocking and read
// through the runtime poller, and the child's, a plain blocking
// descriptor; envd reads from it when parentReads, else writes to it.
//
// Why not os.Pipe: it makes both ends non-blocking and adds both to the
// poller, and Fd on the child's end then makes it blocking again, and its
// Close removes it from the poller: ~8 system calls per pipe that the
// child's end never needed, each ~40 µs of host CPU under gVisor.
func childPipe(parentReads bool) (parent, child *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	mine, theirs := p[1], p[0]
	if parentReads {
		mine, theirs = p[0], p[1]
	}
	// A new pipe's status flags are empty: no need to read them first.
	if _, err := unix.FcntlInt(uintptr(mine), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, err
	}
	// os.NewFile sees O_NONBLOCK on envd's end and polls it; the child's
	// end stays blocking and out of the poller.
	return os.NewFile(uintptr(mine), "|envd"), os.NewFile(uintptr(theirs), "|child"), nil
}

// openPty opens a pty pair. creack/pty leaves the master in blocking mode
// (it calls Fd), which would pin an OS thread per read and keep Close from
// interrupting one; the master is re-opened non-blocking so that it goes
// through the runtime poller like the pipes do.
func openPty() (master, tty *os.File, err error) {
	m, tty, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("opening pty: %w", err)
	}
	defer m.Close()
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err == nil {
		err = unix.SetNonblock(fd, true)
	}
	if err != nil {
		tty.Close()
		return nil, nil, fmt.Errorf("opening pty: %w", err)
	}
	return os.NewFile(uintptr(fd), m.Name()), tty, nil
}

// resizePty applies a new terminal size without touching the master's
// blocking mode (pty.Setsize would).
func resizePty(master *os.File, size ptySize) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return fmt.Errorf("resizing pty: %w", err)
	}
	var ioErr error
	err = rc.Control(func(fd uintptr) {
		ioErr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Col: size.cols, Row: size.rows})
	})
	if err = errors.Join(err, ioErr); err != nil {
		return fmt.Errorf("resizing pty: %w", err)
	}
	return nil
}
