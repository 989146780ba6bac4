package envd

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
)

// spawnSpec describes a process to start.
type spawnSpec struct {
	argv []string // argv[0] is the command as requested
	env  []string
	dir  string
	user *sysUser
	// switchUser sets the child's credentials to user's; only root can.
	switchUser bool
	pty        *ptySize // nil: plain pipes
	stdin      bool     // keep a stdin pipe open (ignored with a pty)
}

type ptySize struct{ cols, rows uint16 }

// child is a started process and the parent's ends of its stdio.
type child struct {
	pid     int
	status  <-chan syscall.WaitStatus
	stdin   *os.File // stdin pipe, nil when stdin was not requested
	pty     *os.File // pty master, nil without a pty
	outputs []output
}

type output struct {
	kind outputKind
	f    *os.File
}

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
		for _, f := range []*os.File{c.stdin, c.pty} {
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
			r, w, err := os.Pipe()
			if err != nil {
				return fail(fmt.Errorf("creating stdin pipe: %w", err))
			}
			c.stdin, in = w, r
		} else {
			in, err = os.Open(os.DevNull)
			if err != nil {
				return fail(fmt.Errorf("opening %s: %w", os.DevNull, err))
			}
		}
		childFiles = append(childFiles, in)
		fds = []uintptr{in.Fd()}
		for _, kind := range []outputKind{outputStdout, outputStderr} {
			r, w, err := os.Pipe()
			if err != nil {
				return fail(fmt.Errorf("creating output pipe: %w", err))
			}
			childFiles = append(childFiles, w)
			c.outputs = append(c.outputs, output{kind: kind, f: r})
			fds = append(fds, w.Fd())
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

// lookPath finds the executable for name like a shell would, using the
// PATH the child will get rather than envd's own.
func lookPath(name string, env []string, dir string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("resolving command: %w: empty command", errInvalid)
	}
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			return "", fmt.Errorf("resolving command %s: %w: %v", name, errInvalid, err)
		}
		return p, nil
	}
	pathVar := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	for _, d := range filepath.SplitList(pathVar) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("resolving command %s: %w: not found in PATH", name, errInvalid)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", p)
	}
	return nil
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
