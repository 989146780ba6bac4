package cli

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
)

// terminal is aenv running on a real pseudo-terminal, as a user sees it.
type terminal struct {
	t    *testing.T
	ptmx *os.File
	cmd  *exec.Cmd
	out  syncBuffer
	seen int // output before this offset has been matched already
	done chan struct{}
}

func startTerminal(t *testing.T, size *pty.Winsize, args ...string) *terminal {
	t.Helper()
	cmd := exec.Command(aenvBinary(t), args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir(), "TERM=xterm")
	ptmx, err := pty.StartWithSize(cmd, size)
	if err != nil {
		t.Fatal(err)
	}
	term := &terminal{t: t, ptmx: ptmx, cmd: cmd, done: make(chan struct{})}
	go func() {
		defer close(term.done)
		_, _ = io.Copy(&term.out, ptmx)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = ptmx.Close()
		<-term.done
	})
	return term
}

// typeIn sends keys as a user would.
func (tm *terminal) typeIn(s string) {
	tm.t.Helper()
	if _, err := tm.ptmx.Write([]byte(s)); err != nil {
		tm.t.Fatalf("typing %q: %v", s, err)
	}
}

// expect waits for output matching re after what was matched before, and
// returns the match's submatches.
func (tm *terminal) expect(re string, timeout time.Duration) []string {
	tm.t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(timeout)
	for {
		all := tm.out.String()
		if loc := rx.FindStringSubmatchIndex(all[tm.seen:]); loc != nil {
			m := rx.FindStringSubmatch(all[tm.seen:])
			tm.seen += loc[1]
			return m
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("no output matching %q within %s; output after the last match:\n%q", re, timeout, all[tm.seen:])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStartInteractive drives 'aenv start base' on a real terminal: typed
// commands run, the window size and its changes reach the sandbox, Ctrl-C
// interrupts the remote command (not aenv), the shell's exit status is
// aenv's, and the sandbox is gone afterwards.
func TestStartInteractive(t *testing.T) {
	e := startServer(t)
	tm := startTerminal(t, &pty.Winsize{Rows: 30, Cols: 90}, "start", "base", "--url", e.url, "--key-file", e.keyFile)

	id := tm.expect(`Sandbox ([a-z0-9]+) \(base\)`, 60*time.Second)[1]
	if !e.exists(t, id) {
		t.Fatalf("sandbox %s does not exist while its shell is open", id)
	}

	tm.typeIn("echo hi-$((1+2))\r")
	tm.expect(`hi-3`, 30*time.Second)

	tm.typeIn("stty size\r")
	tm.expect(`30 90`, 10*time.Second)
	if err := pty.Setsize(tm.ptmx, &pty.Winsize{Rows: 40, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	// The resize travels asynchronously (SIGWINCH, then Update); ask until
	// the sandbox's terminal has caught up.
	deadline := time.Now().Add(10 * time.Second)
	for {
		tm.typeIn("stty size\r")
		time.Sleep(300 * time.Millisecond)
		if strings.Contains(tm.out.String()[tm.seen:], "40 100") {
			tm.seen = len(tm.out.String())
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox's terminal never became 40x100; output: %q", tm.out.String()[tm.seen:])
		}
	}

	// Ctrl-C is a byte for the sandbox's terminal: it interrupts sleep and
	// the shell carries on (if it did not, sleep would outlast expect).
	tm.typeIn("sleep 60\r")
	time.Sleep(time.Second)
	tm.typeIn("\x03")
	tm.typeIn("echo after-$((2+2))\r")
	tm.expect(`after-4`, 20*time.Second)

	tm.typeIn("exit 7\r")
	waitErr := make(chan error, 1)
	go func() { waitErr <- tm.cmd.Wait() }()
	select {
	case err := <-waitErr:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 7 {
			t.Fatalf("aenv start ended with %v, want exit status 7; output:\n%q", err, tm.out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("aenv start did not exit after 'exit 7'; output:\n%q", tm.out.String())
	}
	if e.exists(t, id) {
		t.Fatalf("sandbox %s still exists after its shell exited", id)
	}
}

// TestStartPiped runs the shell without a terminal: stdin is its script.
func TestStartPiped(t *testing.T) {
	e := startServer(t)
	before := listIDs(t, e)
	r := e.run(t, "echo piped-$((2*3))\necho to-stderr >&2\nexit 5\n", "start", "base")
	if r.code != 5 {
		t.Fatalf("exit %d, want 5; stderr %q", r.code, r.stderr)
	}
	if r.stdout != "piped-6\n" || r.stderr != "to-stderr\n" {
		t.Fatalf("stdout %q stderr %q, want %q and %q", r.stdout, r.stderr, "piped-6\n", "to-stderr\n")
	}
	if after := listIDs(t, e); len(after) != len(before) {
		t.Fatalf("sandboxes before %v, after %v: the started one was not killed", before, after)
	}

	// EOF ends the shell: exit status 0.
	r = e.run(t, "true\n", "start", "base")
	if r.code != 0 {
		t.Fatalf("exit %d, want 0; stderr %q", r.code, r.stderr)
	}
}

func TestStartDetachKeepAndConnect(t *testing.T) {
	e := startServer(t)
	id := strings.TrimSpace(e.mustRun(t, "start", "-d", "base", "--timeout", "120"))
	t.Cleanup(func() { _ = e.c.Kill(context.Background(), id) })
	if !e.exists(t, id) {
		t.Fatalf("start -d printed %q, which does not exist", id)
	}
	// connect never kills the sandbox, whatever the shell's status.
	r := e.run(t, "echo connected > /tmp/mark\nexit 3\n", "connect", id)
	if r.code != 3 {
		t.Fatalf("connect: exit %d, want 3; stderr %q", r.code, r.stderr)
	}
	if !e.exists(t, id) {
		t.Fatalf("connect killed sandbox %s", id)
	}
	if out := e.mustRun(t, "exec", id, "--", "cat /tmp/mark"); out != "connected\n" {
		t.Fatalf("the connected shell's file holds %q", out)
	}

	// --keep leaves the sandbox behind.
	before := listIDs(t, e)
	r = e.run(t, "exit\n", "start", "base", "--keep")
	if r.code != 0 {
		t.Fatalf("start --keep: exit %d; stderr %q", r.code, r.stderr)
	}
	after := listIDs(t, e)
	if len(after) != len(before)+1 {
		t.Fatalf("start --keep: sandboxes before %v, after %v", before, after)
	}
	for _, id := range after {
		if !slices.Contains(before, id) {
			_ = e.c.Kill(context.Background(), id)
		}
	}
}

func listIDs(t *testing.T, e *testEnv) []string {
	t.Helper()
	list, err := e.c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(list))
	for _, sb := range list {
		ids = append(ids, sb.SandboxID)
	}
	return ids
}
