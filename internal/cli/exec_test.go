package cli

import (
	"strings"
	"testing"
	"time"
)

func TestExec(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base", "--env", "FROM_CREATE=yes")

	t.Run("exit code and streams", func(t *testing.T) {
		r := e.run(t, "", "exec", id, "--", "echo out; echo err >&2; exit 3")
		if r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
			t.Fatalf("got exit %d stdout %q stderr %q, want 3, %q, %q", r.code, r.stdout, r.stderr, "out\n", "err\n")
		}
	})
	t.Run("without --", func(t *testing.T) {
		if out := e.mustRun(t, "exec", id, "echo", "-n", "x"); out != "x" {
			t.Fatalf("got %q", out)
		}
	})
	t.Run("words are quoted", func(t *testing.T) {
		out := e.mustRun(t, "exec", id, "--", "printf", "%s|", "a b", "it's", "$HOME")
		if out != "a b|it's|$HOME|" {
			t.Fatalf("got %q", out)
		}
	})
	t.Run("env", func(t *testing.T) {
		out := e.mustRun(t, "exec", "--env", "A=1", "--env", "B=two words", id, "--", `echo "$A/$B/$FROM_CREATE"`)
		if out != "1/two words/yes\n" {
			t.Fatalf("got %q", out)
		}
	})
	t.Run("user and cwd", func(t *testing.T) {
		out := e.mustRun(t, "exec", "--user", "root", "--cwd", "/tmp", id, "--", "echo $(whoami) $PWD")
		if out != "root /tmp\n" {
			t.Fatalf("got %q", out)
		}
	})
	t.Run("killed by a signal", func(t *testing.T) {
		r := e.run(t, "", "exec", id, "--", "kill -9 $$")
		if r.code != 128+9 {
			t.Fatalf("exit %d, want 137; stderr %q", r.code, r.stderr)
		}
		oneErrorLine(t, r, "killed")
	})
	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		r := e.run(t, "", "exec", "--timeout", "1", id, "--", "sleep 30")
		if r.code != exitTimedOut {
			t.Fatalf("exit %d, want %d; stderr %q", r.code, exitTimedOut, r.stderr)
		}
		oneErrorLine(t, r, "timed out after 1s")
		if el := time.Since(start); el > 15*time.Second {
			t.Fatalf("--timeout 1 took %s", el)
		}
		// The command is gone, not left running in the background.
		if out := e.mustRun(t, "exec", id, "--", "cat /proc/[0-9]*/comm 2>/dev/null | grep -x sleep || echo none"); out != "none\n" {
			t.Fatalf("sleep still runs after the timeout: %q", out)
		}
	})
}

// TestExecStreams checks that output arrives while the command still runs.
func TestExecStreams(t *testing.T) {
	e := startServer(t)
	id := e.create(t, "base")
	first := make(chan time.Time, 1)
	out := &syncBuffer{onWrite: func(all string) {
		if strings.Contains(all, "first") {
			select {
			case first <- time.Now():
			default:
			}
		}
	}}
	done := make(chan result, 1)
	go func() {
		done <- e.runWith(t, strings.NewReader(""), out, "exec", id, "--", "echo first; sleep 3; echo second")
	}()
	select {
	case <-first:
	case r := <-done:
		t.Fatalf("exec ended (exit %d, stdout %q) before its first line was seen", r.code, r.stdout)
	case <-time.After(60 * time.Second):
		t.Fatal("no output within 60s")
	}
	select {
	case r := <-done:
		t.Fatalf("exec had already ended when its first line arrived: the output was not streamed (%q)", r.stdout)
	default:
	}
	r := <-done
	if r.code != 0 || r.stdout != "first\nsecond\n" {
		t.Fatalf("exit %d stdout %q", r.code, r.stdout)
	}
}
