package interpreter

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// bashKernel keeps one bash process for a context, so that variables,
// functions and the working directory persist between executions, as in a
// notebook. No Jupyter kernel for bash ships in Debian (bash_kernel and
// metakernel are PyPI-only), and a shell needs little: each execution is
// sourced from a file, then markers on stdout and stderr say it ended.
type bashKernel struct {
	log    *slog.Logger
	dir    string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    chan chunk
	exited chan struct{}
	// quit ends the pumps: nobody reads out any more.
	quit     chan struct{}
	quitOnce sync.Once
	pipes    []*os.File
	pumps    sync.WaitGroup
	count    int
	seq      int
}

// chunk is output read from the shell.
type chunk struct {
	stderr bool
	data   []byte
}

var validEnvName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func startBashKernel(log *slog.Logger, opts kernelOptions) (*bashKernel, error) {
	dir, err := os.MkdirTemp("", "aenv-bash-")
	if err != nil {
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	if opts.Cred != nil {
		os.Chown(dir, int(opts.Cred.Uid), int(opts.Cred.Gid))
	}
	k := &bashKernel{log: log, dir: dir, out: make(chan chunk, 64), exited: make(chan struct{}), quit: make(chan struct{})}
	k.cmd = exec.Command("bash", "--noprofile", "--norc")
	k.cmd.Dir, k.cmd.Env = opts.Cwd, opts.Env
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: opts.Cred}
	if k.stdin, err = k.cmd.StdinPipe(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	// Pipes of our own, not StdoutPipe: the shell's exit is then seen at
	// once (Wait does not wait for them), even while a background job it
	// started holds them open.
	outR, outW, err := os.Pipe()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	k.cmd.Stdout, k.cmd.Stderr = outW, errW
	err = k.cmd.Start()
	outW.Close()
	errW.Close()
	k.pipes = []*os.File{outR, errR}
	if err != nil {
		outR.Close()
		errR.Close()
		os.RemoveAll(dir)
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	pump := func(r io.Reader, isErr bool) {
		defer k.pumps.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				select {
				case k.out <- chunk{stderr: isErr, data: bytes.Clone(buf[:n])}:
				case <-k.quit:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	k.pumps.Add(2)
	go pump(outR, false)
	go pump(errR, true)
	go func() { k.cmd.Wait(); close(k.exited) }()
	return k, nil
}

// shellQuote quotes s for bash.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// execute runs code in the shell, streaming its output through emit.
// A failing last command is reported as an error, like a raised exception.
func (k *bashKernel) execute(ctx context.Context, code string, env map[string]string, emit func(event)) error {
	k.seq++
	file := filepath.Join(k.dir, "cell-"+strconv.Itoa(k.seq)+".sh")
	if err := os.WriteFile(file, []byte(code), 0o644); err != nil {
		return fmt.Errorf("running bash: %w", err)
	}
	defer os.Remove(file)
	if k.cmd.SysProcAttr.Credential != nil {
		os.Chown(file, int(k.cmd.SysProcAttr.Credential.Uid), int(k.cmd.SysProcAttr.Credential.Gid))
	}
	// Output of background jobs since the last execution is not this
	// one's.
	for drained := false; !drained; {
		select {
		case <-k.out:
		default:
			drained = true
		}
	}
	mark := "\x1eaenv-" + newToken() + "\x1e"
	var pre, post strings.Builder
	for name, v := range env {
		if !validEnvName.MatchString(name) {
			return fmt.Errorf("running bash: %q is not a variable name", name)
		}
		saved := "__aenv_saved_" + name
		fmt.Fprintf(&pre, "if [ -n \"${%s+x}\" ]; then %s=$%s; else unset %s; fi; export %s=%s\n", name, saved, name, saved, name, shellQuote(v))
		fmt.Fprintf(&post, "if [ -n \"${%s+x}\" ]; then %s=$%s; else unset %s; fi\n", saved, name, saved, name)
	}
	script := pre.String() + ". " + shellQuote(file) + " </dev/null\n__aenv_rc=$?\n" + post.String() +
		"printf '%s %d\\n' " + shellQuote(mark) + " $__aenv_rc\nprintf '%s\\n' " + shellQuote(mark) + " >&2\n"
	if _, err := io.WriteString(k.stdin, script); err != nil {
		return fmt.Errorf("running bash: the shell is gone: %w", err)
	}
	var outBuf, errBuf []byte
	outDone, errDone := false, false
	rc := 0
	// flush emits what is surely output: everything before the marker, or
	// all but a tail that could be the start of one.
	flush := func(buf []byte, isErr bool) ([]byte, bool) {
		typ := "stdout"
		if isErr {
			typ = "stderr"
		}
		if i := bytes.Index(buf, []byte(mark)); i >= 0 {
			if i > 0 {
				emit(event{"type": typ, "text": string(buf[:i])})
			}
			if !isErr {
				fields := strings.Fields(string(buf[i+len(mark):]))
				if len(fields) > 0 {
					rc, _ = strconv.Atoi(fields[0])
				}
			}
			return nil, true
		}
		keep := min(len(buf), len(mark))
		if n := len(buf) - keep; n > 0 {
			emit(event{"type": typ, "text": string(buf[:n])})
			buf = buf[n:]
		}
		return buf, false
	}
	done := ctx.Done()
	for !outDone || !errDone {
		select {
		case c := <-k.out:
			if c.stderr {
				errBuf = append(errBuf, c.data...)
				errBuf, errDone = flush(errBuf, true)
			} else {
				outBuf = append(outBuf, c.data...)
				if i := bytes.Index(outBuf, []byte(mark)); i >= 0 && !bytes.Contains(outBuf[i:], []byte("\n")) {
					continue // the exit status is still to come
				}
				outBuf, outDone = flush(outBuf, false)
			}
		case <-done:
			// A shell cannot be interrupted back to its prompt reliably
			// (a trapped SIGINT resumes the sourced file): the caller
			// restarts the context.
			return ctx.Err()
		case <-k.exited:
			return fmt.Errorf("the shell exited (%v); the context restarts with a new one", k.cmd.ProcessState)
		}
	}
	k.count++
	if rc != 0 {
		emit(event{"type": "error", "name": "CommandExitError", "value": "exit status " + strconv.Itoa(rc), "traceback": ""})
	}
	emit(event{"type": "number_of_executions", "execution_count": k.count})
	return nil
}

func (k *bashKernel) close() {
	k.quitOnce.Do(func() { close(k.quit) })
	if k.cmd.Process != nil {
		syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		<-k.exited
	}
	// A job that left the process group may still hold the pipes' other
	// ends: closing ours ends the pumps regardless.
	for _, p := range k.pipes {
		p.Close()
	}
	k.pumps.Wait()
	os.RemoveAll(k.dir)
}

// setEnv exports env in the shell for good (the sandbox's environment).
func (k *bashKernel) setEnv(ctx context.Context, env map[string]string) error {
	var b strings.Builder
	for name, v := range env {
		if validEnvName.MatchString(name) {
			fmt.Fprintf(&b, "export %s=%s\n", name, shellQuote(v))
		}
	}
	err := k.execute(ctx, b.String(), nil, func(event) {})
	k.count-- // not one of the user's executions
	return err
}
