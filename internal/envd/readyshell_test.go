package envd_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/envd"
	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// readyMark is in the command line of a ready shell (its bootstrap) and
// never in a spawned `bash -l -c CMD`'s, unless CMD names it.
const readyMark = "__aenv_cmd"

// selfCmdline prints the command line of the shell running the command,
// spaces for NULs, on a line of its own after the command's output.
const selfCmdline = `; echo; tr '\0' ' ' </proc/$$/cmdline`

func withReadyShell(o *envd.Options) { o.ReadyShell = true }

// runReady runs script as the SDKs do and reports its output (without the
// command line selfCmdline adds) and whether a ready shell ran it.
func (e *env) runReady(cfg *process.ProcessConfig, user string) (out string, ready bool, r *result) {
	e.t.Helper()
	if !strings.HasSuffix(cfg.Args[2], selfCmdline) {
		cfg.Args[2] += selfCmdline
	}
	r = e.run(cfg, user)
	all := r.stdout.String()
	i := strings.LastIndex(strings.TrimSuffix(all, "\n"), "\n")
	if i < 0 {
		e.t.Fatalf("no command line in the output %q", all)
	}
	return all[:i], strings.Contains(all[i:], readyMark), r
}

func writeProfile(t *testing.T, e *env, content string) {
	t.Helper()
	path := filepath.Join(e.home, ".profile")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		uid, gid := testIDs()
		if err := os.Chown(path, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReadyShellRunsCommandsAsBashDoes(t *testing.T) {
	e := newEnv(t, withReadyShell)
	// The shell New started may have read the profile before it was
	// written; the one started after the first command ends has not.
	writeProfile(t, e, "export FROM_PROFILE=yes\n")
	e.run(bashCmd("true"), "")
	waitFor(t, 10*time.Second, "the ready shell to start again", func() bool { return readyShellPid(e.home) != 0 })

	out, ready, r := e.runReady(bashCmd(`echo "$FROM_PROFILE|$?|$0|$HOSTNAME|${__aenv_cmd-unset}|$(shopt login_shell)"; echo err >&2; ls /proc/self/fd/3 2>/dev/null || echo "no fd 3"; false`), "")
	if !ready {
		t.Fatal("a default login-shell command after an idle moment was not run by the ready shell")
	}
	host, _ := os.Hostname()
	want := "yes|0|/bin/bash|" + host + "|unset|login_shell    \ton\nno fd 3\n"
	if out != want {
		t.Fatalf("stdout = %q, want %q", out, want)
	}
	if r.stderr.String() != "err\n" {
		t.Fatalf("stderr = %q", r.stderr.String())
	}
	// The exit status is the command's, not the shell's bootstrap's.
	if r.end.GetExitCode() != 0 {
		t.Fatalf("exit code %d: the last command was `echo`", r.end.GetExitCode())
	}
	r = e.run(bashCmd("exit 7"), "")
	if r.end.GetExitCode() != 7 {
		t.Fatalf("exit 7 ended with %v", r.end)
	}

	// Each command gets its own random numbers, though every ready shell
	// may come from one snapshot.
	seen := map[string]bool{}
	for range 4 {
		out, ready, _ := e.runReady(bashCmd("echo $RANDOM$RANDOM$RANDOM"), "")
		if !ready {
			t.Fatal("a command in a sequence was not run by the ready shell")
		}
		seen[out] = true
	}
	if len(seen) != 4 {
		t.Fatalf("4 commands printed %d different random sequences", len(seen))
	}

	// Large commands are read whole.
	big := strings.Repeat("x", 300<<10)
	out, ready, _ = e.runReady(bashCmd("v="+big+"; echo ${#v}"), "")
	if !ready || out != strconv.Itoa(len(big))+"\n" {
		t.Fatalf("a %d-byte command: ready %v, printed %q", len(big), ready, out)
	}
}

func TestReadyShellSeesWhatEarlierCommandsChanged(t *testing.T) {
	e := newEnv(t, withReadyShell)
	writeProfile(t, e, `[ -d "$HOME/bin" ] && export HAS_BIN=1`+"\n")
	e.run(bashCmd("true"), "")

	// A command changes what the profile finds: the next command's shell
	// must have started after it.
	if r := e.run(bashCmd(`mkdir "$HOME/bin" && echo 'export APPENDED=1' >> "$HOME/.profile"`), ""); r.end.GetExitCode() != 0 {
		t.Fatalf("changing the profile's world: %v %s", r.end, r.stderr.String())
	}
	out, ready, _ := e.runReady(bashCmd(`echo "${HAS_BIN-}|${APPENDED-}"`), "")
	if out != "1|1\n" {
		t.Fatalf("after a command changed the profile's world: %q, want %q", out, "1|1\n")
	}
	if !ready {
		t.Fatal("the command after another ended was not run by a ready shell")
	}

	// So must a file written through envd.
	res, body := e.httpDo("POST", "/files?path="+filepath.Join(e.home, ".profile"), strings.NewReader("export UPLOADED=1\n"),
		map[string]string{"Content-Type": "application/octet-stream"})
	if res.StatusCode != 200 {
		t.Fatalf("upload: %d %s", res.StatusCode, body)
	}
	if out, _, _ := e.runReady(bashCmd(`echo "${UPLOADED-}|${APPENDED-}"`), ""); out != "1|\n" {
		t.Fatalf("after an upload replaced the profile: %q, want %q", out, "1|\n")
	}

	// And /init's variables.
	res, body = e.httpDo("POST", "/init", strings.NewReader(`{"envVars":{"FROM_INIT":"i"}}`), map[string]string{"Content-Type": "application/json"})
	if res.StatusCode != 204 {
		t.Fatalf("/init: %d %s", res.StatusCode, body)
	}
	out, ready, _ = e.runReady(bashCmd(`echo "${FROM_INIT-}"`), "")
	if out != "i\n" || !ready {
		t.Fatalf("after /init: %q (ready shell %v), want %q from a ready shell", out, ready, "i\n")
	}
}

func TestReadyShellOnlyForTheDefaultLaunch(t *testing.T) {
	e := newEnv(t, withReadyShell)
	e.run(bashCmd("true"), "")
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	withEnv := bashCmd(`echo "$ONLY_HERE"`)
	withEnv.Envs = map[string]string{"ONLY_HERE": "req"}
	withCwd := bashCmd("pwd")
	withCwd.Cwd = &dir
	for _, tc := range []struct {
		name string
		cfg  *process.ProcessConfig
		user string
		want string
	}{
		{"variables", withEnv, "", "req\n"},
		{"directory", withCwd, "", dir + "\n"},
		{"other user", bashCmd("id -u"), "root", "0\n"},
		{"more arguments", &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", `echo "$1"` + selfCmdline, "x", "arg"}}, "", "arg\n"},
	} {
		if tc.user == "root" && os.Geteuid() != 0 {
			continue
		}
		out, ready, _ := e.runReady(tc.cfg, tc.user)
		if ready || out != tc.want {
			t.Errorf("%s: printed %q (ready shell %v), want %q from a spawned shell", tc.name, out, ready, tc.want)
		}
	}
	// After commands it could not serve, the default one gets it again.
	e.run(bashCmd("true"), "")
	if _, ready, _ := e.runReady(bashCmd("true"), ""); !ready {
		t.Fatal("the ready shell did not come back for default commands")
	}
}

func TestReadyShellKilledBeforeUseIsNotUsed(t *testing.T) {
	e := newEnv(t, withReadyShell)
	e.run(bashCmd("true"), "")
	var pid int
	waitFor(t, 10*time.Second, "the ready shell to start", func() bool {
		pid = readyShellPid(e.home)
		return pid != 0
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	out, ready, r := e.runReady(bashCmd("echo ok"), "")
	if out != "ok\n" || ready || r.end.GetExitCode() != 0 {
		t.Fatalf("after the ready shell was killed: %q (ready shell %v), %v", out, ready, r.end)
	}

	e.run(bashCmd("true"), "")
	waitFor(t, 10*time.Second, "the ready shell to start again", func() bool { return readyShellPid(e.home) != 0 })
	e.srv.Close()
	waitFor(t, 10*time.Second, "Close to end the ready shell", func() bool { return readyShellPid(e.home) == 0 })
}

// readyShellPid finds the ready shell of the envd whose user lives in
// home (0: none runs), by its command line and environment.
func readyShellPid(home string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(readyMark)) {
			continue
		}
		environ, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, environ...), []byte("\x00HOME="+home+"\x00")) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join(d, "stat")); err == nil && bytes.Contains(st, []byte(") Z ")) {
			continue // a zombie the reaper has yet to collect
		}
		pid, _ := strconv.Atoi(filepath.Base(d))
		return pid
	}
	return 0
}

func TestReadyShellDroppedWhenIdle(t *testing.T) {
	e := newEnv(t, withReadyShell, func(o *envd.Options) {
		o.ReadyShellIdle = 300 * time.Millisecond
		o.ReadyShellLone = 50 * time.Millisecond
	})
	// Before any command, as in a template's snapshot, it stays.
	waitFor(t, 10*time.Second, "the first ready shell to start", func() bool { return readyShellPid(e.home) != 0 })
	time.Sleep(600 * time.Millisecond)
	if readyShellPid(e.home) == 0 {
		t.Fatal("the ready shell of a sandbox that never ran a command was dropped")
	}
	e.run(bashCmd("true"), "")
	waitFor(t, 10*time.Second, "the command's end to start a ready shell", func() bool { return readyShellPid(e.home) != 0 })
	waitFor(t, 10*time.Second, "an idle sandbox to drop its ready shell", func() bool { return readyShellPid(e.home) == 0 })
	time.Sleep(100 * time.Millisecond)
	if readyShellPid(e.home) != 0 {
		t.Fatal("a ready shell started again while nothing happened")
	}
	// The next command starts its own shell; one a moment later has a
	// ready one again.
	if out, ready, _ := e.runReady(bashCmd("echo a"), ""); ready || out != "a\n" {
		t.Fatalf("first command after the idle period: %q (ready shell %v)", out, ready)
	}
	waitFor(t, 10*time.Second, "the command's end to start a ready shell", func() bool { return readyShellPid(e.home) != 0 })
	if out, ready, _ := e.runReady(bashCmd("echo b"), ""); !ready || out != "b\n" {
		t.Fatalf("second command after the idle period: %q (ready shell %v)", out, ready)
	}

	// A pooled sandbox waits dormant; its handout's /init brings the
	// shell back for the first command.
	waitFor(t, 10*time.Second, "the command's end to start a ready shell", func() bool { return readyShellPid(e.home) != 0 })
	waitFor(t, 10*time.Second, "the ready shell to be dropped again", func() bool { return readyShellPid(e.home) == 0 })
	if res, body := e.httpDo("POST", "/init", strings.NewReader(`{}`), map[string]string{"Content-Type": "application/json"}); res.StatusCode != 204 {
		t.Fatalf("/init: %d %s", res.StatusCode, body)
	}
	if out, ready, _ := e.runReady(bashCmd("echo c"), ""); !ready || out != "c\n" {
		t.Fatalf("first command after /init woke a dormant sandbox: %q (ready shell %v)", out, ready)
	}
}

func TestReadyShellKeptThroughLearnedPauses(t *testing.T) {
	const idle = 300 * time.Millisecond
	e := newEnv(t, withReadyShell, func(o *envd.Options) {
		o.ReadyShellIdle = idle
		o.ReadyShellLone = 50 * time.Millisecond
	})
	waitFor(t, 10*time.Second, "the first ready shell to start", func() bool { return readyShellPid(e.home) != 0 })
	e.run(bashCmd("true"), "")
	waitFor(t, 10*time.Second, "the command's end to start a ready shell", func() bool { return readyShellPid(e.home) != 0 })
	// A pause past the idle period drops the shell once, as an agent's
	// first long turn does...
	const pause = 4 * idle
	time.Sleep(pause)
	if out, ready, _ := e.runReady(bashCmd("echo a"), ""); ready || out != "a\n" {
		t.Fatalf("first command after a pause past the idle period: %q (ready shell %v)", out, ready)
	}
	// ...and the same pause again finds one: the shell is kept for twice
	// the pauses seen.
	waitFor(t, 10*time.Second, "the command's end to start a ready shell", func() bool { return readyShellPid(e.home) != 0 })
	time.Sleep(pause)
	if out, ready, _ := e.runReady(bashCmd("echo b"), ""); !ready || out != "b\n" {
		t.Fatalf("command after a pause like the one before: %q (ready shell %v)", out, ready)
	}
	// Nobody coming back, it is still dropped.
	waitFor(t, 10*time.Second, "the command's end to start a ready shell", func() bool { return readyShellPid(e.home) != 0 })
	waitFor(t, 10*time.Second, "an idle sandbox to drop its ready shell", func() bool { return readyShellPid(e.home) == 0 })
}

func TestReadyShellKeptAfterInitUntilTheNextCommand(t *testing.T) {
	const idle = 300 * time.Millisecond
	e := newEnv(t, withReadyShell, func(o *envd.Options) {
		o.ReadyShellIdle = idle
		o.ReadyShellLone = 50 * time.Millisecond
	})
	// The pool runs a command in a prestarted sandbox, then gives it its
	// /init: it waits with a shell, however long, as an unused one does.
	e.run(bashCmd("true"), "")
	if res, body := e.httpDo("POST", "/init", strings.NewReader(`{}`), map[string]string{"Content-Type": "application/json"}); res.StatusCode != 204 {
		t.Fatalf("/init: %d %s", res.StatusCode, body)
	}
	waitFor(t, 10*time.Second, "a ready shell after /init", func() bool { return readyShellPid(e.home) != 0 })
	time.Sleep(4 * idle)
	if out, ready, _ := e.runReady(bashCmd("echo a"), ""); !ready || out != "a\n" {
		t.Fatalf("first command after /init and a pause: %q (ready shell %v)", out, ready)
	}
	// From that command on, the idle period counts again.
	waitFor(t, 10*time.Second, "an idle sandbox to drop its ready shell", func() bool { return readyShellPid(e.home) == 0 })
}

func TestReadyShellWaitsAfterALoneCommand(t *testing.T) {
	const lone = 3 * time.Second
	e := newEnv(t, withReadyShell, func(o *envd.Options) { o.ReadyShellLone = lone })
	waitFor(t, 10*time.Second, "the first ready shell to start", func() bool { return readyShellPid(e.home) != 0 })
	// The first command, as in a sandbox just taken from the pool, is
	// lone: no shell starts beside whatever else the host is doing.
	if _, ready, _ := e.runReady(bashCmd("true"), ""); !ready {
		t.Fatal("the first command was not run by the ready shell started ahead")
	}
	time.Sleep(300 * time.Millisecond)
	if readyShellPid(e.home) != 0 {
		t.Fatalf("a ready shell started within 300ms of a lone command's end (want %v)", lone)
	}
	// A command soon after starts its own shell; it makes a sequence, so
	// the next has a ready one at once.
	if out, ready, _ := e.runReady(bashCmd("echo a"), ""); ready || out != "a\n" {
		t.Fatalf("the command after a lone one: %q (ready shell %v), want a spawned shell", out, ready)
	}
	for _, word := range []string{"b", "c"} {
		if out, ready, _ := e.runReady(bashCmd("echo "+word), ""); !ready || out != word+"\n" {
			t.Fatalf("a command in a sequence: %q (ready shell %v), want it from a ready shell", out, ready)
		}
	}
	// A pause longer than a sequence's (2 s, with a margin for a slow
	// host) makes the next command lone again; its shell comes, later.
	time.Sleep(2500 * time.Millisecond)
	if _, ready, _ := e.runReady(bashCmd("true"), ""); !ready {
		t.Fatal("the command after a pause was not run by the ready shell the sequence left")
	}
	ended := time.Now()
	time.Sleep(300 * time.Millisecond)
	if readyShellPid(e.home) != 0 {
		t.Fatal("a ready shell started at once after a command that came after a pause")
	}
	waitFor(t, 10*time.Second, "a ready shell after the lone command", func() bool { return readyShellPid(e.home) != 0 })
	if waited := time.Since(ended); waited < lone-500*time.Millisecond {
		t.Fatalf("the ready shell started %v after a lone command's end, want about %v", waited, lone)
	}
}

// A lone command's delayed refill is called off by the sequence that
// follows it: no shell starts, to be killed unused, while a command of
// the sequence runs.
func TestReadyShellLoneRefillCalledOffBySequence(t *testing.T) {
	const lone = 500 * time.Millisecond
	e := newEnv(t, withReadyShell, func(o *envd.Options) { o.ReadyShellLone = lone })
	waitFor(t, 10*time.Second, "the first ready shell to start", func() bool { return readyShellPid(e.home) != 0 })
	writeProfile(t, e, `echo $$ >> "$HOME/profile-reads"`+"\n")
	reads := func() int {
		b, _ := os.ReadFile(filepath.Join(e.home, "profile-reads"))
		return bytes.Count(b, []byte("\n"))
	}
	e.run(bashCmd("true"), "") // lone: its refill comes 500 ms after its end
	e.run(bashCmd("true"), "") // a sequence: its end refills at once
	// The first shell may have read the profile after writeProfile, or not.
	var before int
	waitFor(t, 10*time.Second, "the sequence's ready shell", func() bool {
		n := reads()
		time.Sleep(100 * time.Millisecond)
		before = reads()
		return before >= 2 && n == before
	})
	out, ready, _ := e.runReady(bashCmd("sleep 1; echo slept"), "")
	if !ready || out != "slept\n" {
		t.Fatalf("the sequence's next command: %q (ready shell %v)", out, ready)
	}
	if n := reads(); n != before {
		t.Fatalf("%d shells started while the sequence's command ran, past the lone command's refill", n-before)
	}
}
