package envd_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
	"github.com/aenvhq/aenv/internal/testutil"
)

func TestStartStreamsOutputAsItIsProduced(t *testing.T) {
	e := newEnv(t)
	begin := time.Now()
	r := e.run(bashCmd("echo a; sleep 1; echo b"), "")
	done := time.Now()
	if got := r.stdout.String(); got != "a\nb\n" {
		t.Fatalf("stdout = %q, want %q", got, "a\nb\n")
	}
	if r.pid == 0 {
		t.Fatal("no start event with a pid")
	}
	if first := r.firstData.Sub(begin); first > 700*time.Millisecond {
		t.Fatalf("first output arrived after %v: output is buffered until exit", first)
	}
	if total := done.Sub(begin); total < time.Second {
		t.Fatalf("stream ended after %v, before the process could have", total)
	}
}

func TestStartReportsExitCodeAndStderr(t *testing.T) {
	e := newEnv(t)
	r := e.run(bashCmd("echo out; echo err >&2; exit 7"), "")
	if r.stdout.String() != "out\n" || r.stderr.String() != "err\n" {
		t.Fatalf("stdout %q stderr %q", r.stdout.String(), r.stderr.String())
	}
	end := r.end
	if end.GetExitCode() != 7 || !end.GetExited() || end.GetStatus() != "exit status 7" || end.GetError() != "exit status 7" {
		t.Fatalf("end = %v", end)
	}

	ok := e.run(bashCmd("true"), "")
	if ok.end.GetExitCode() != 0 || !ok.end.GetExited() || ok.end.Error != nil || ok.end.GetStatus() != "exit status 0" {
		t.Fatalf("end of a successful command = %v", ok.end)
	}

	ctx := context.Background()
	_, err := e.proc.Start(ctx, req(e, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/does/not/exist"}}, ""))
	if err == nil {
		s, _ := e.proc.Start(ctx, req(e, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/does/not/exist"}}, ""))
		_, err = collect(s)
	}
	if connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("starting a missing command: %v, want invalid_argument", err)
	}
}

func TestStartEnvironmentAndWorkingDirectory(t *testing.T) {
	e := newEnv(t)
	res, body := e.httpDo("POST", "/init", strings.NewReader(`{"envVars":{"GLOBAL":"g","OVER":"init"}}`), map[string]string{"Content-Type": "application/json"})
	if res.StatusCode != 204 {
		t.Fatalf("/init: %d %s", res.StatusCode, body)
	}
	cfg := bashCmd(`echo "$GLOBAL|$OVER|$REQ|$HOME|$USER|$LOGNAME|${AENV_ENVD_ACCESS_TOKEN-unset}|$(pwd)"; echo "$PATH"`)
	cfg.Envs = map[string]string{"OVER": "req", "REQ": "r"}
	r := e.run(cfg, "")
	lines := strings.Split(r.stdout.String(), "\n")
	want := "g|req|r|" + e.home + "|user|user|unset|" + e.home
	if lines[0] != want {
		t.Fatalf("got %q, want %q", lines[0], want)
	}
	if !strings.Contains(lines[1], "/usr/bin") {
		t.Fatalf("PATH = %q", lines[1])
	}

	dir := t.TempDir()
	cfg = bashCmd("pwd")
	cfg.Cwd = &dir
	if got := strings.TrimSpace(e.run(cfg, "").stdout.String()); got != dir {
		t.Fatalf("pwd = %q, want %q", got, dir)
	}

	missing := dir + "/missing"
	cfg.Cwd = &missing
	s, err := e.proc.Start(context.Background(), req(e, &process.StartRequest{Process: cfg}, ""))
	if err == nil {
		_, err = collect(s)
	}
	if connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("missing cwd: %v, want invalid_argument", err)
	}
}

func TestStartSwitchesUser(t *testing.T) {
	testutil.RequireRoot(t)
	e := newEnv(t)
	r := e.run(bashCmd("id -u; id -g; id -G"), "user")
	fields := strings.Fields(r.stdout.String())
	if len(fields) < 3 || fields[0] != "65534" || fields[1] != "65534" {
		t.Fatalf("id as user: %q", r.stdout.String())
	}
	if !slices.Contains(fields[2:], strconv.Itoa(supplementaryGID)) {
		t.Fatalf("supplementary group %d missing: %q", supplementaryGID, r.stdout.String())
	}
	// The default user is "user" too.
	if got := strings.Fields(e.run(bashCmd("id -u"), "").stdout.String()); got[0] != "65534" {
		t.Fatalf("default user ran as %v", got)
	}
	if got := strings.TrimSpace(e.run(bashCmd("id -u"), "root").stdout.String()); got != "0" {
		t.Fatalf("root ran as %q", got)
	}

	s, err := e.proc.Start(context.Background(), req(e, &process.StartRequest{Process: bashCmd("true")}, "nosuchuser"))
	if err == nil {
		_, err = collect(s)
	}
	if connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("unknown user: %v, want invalid_argument", err)
	}
}

// startBackground starts cfg and returns its pid and the open stream.
func startBackground(t *testing.T, e *env, ctx context.Context, sr *process.StartRequest) (uint32, *connect.ServerStreamForClient[process.StartResponse]) {
	t.Helper()
	s, err := e.proc.Start(ctx, req(e, sr, ""))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatalf("no start event: %v", s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		t.Fatalf("first event is not start: %v", s.Msg())
	}
	return pid, s
}

func pidSel(pid uint32) *process.ProcessSelector {
	return &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
}

func TestStdinSendInputAndCloseStdin(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pid, s := startBackground(t, e, ctx, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "cat"}, Stdin: ptr(true)})
	if _, err := e.proc.SendInput(ctx, req(e, &process.SendInputRequest{
		Process: pidSel(pid),
		Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("hello\n")}},
	}, "")); err != nil {
		t.Fatal(err)
	}
	r := &result{pid: pid}
	for !strings.Contains(r.stdout.String(), "hello\n") {
		if !s.Receive() {
			t.Fatalf("stream ended before the echo: %v", s.Err())
		}
		_ = r.add(s.Msg().GetEvent())
	}
	if _, err := e.proc.CloseStdin(ctx, req(e, &process.CloseStdinRequest{Process: pidSel(pid)}, "")); err != nil {
		t.Fatal(err)
	}
	rest, err := drain(&result{pid: pid}, s)
	if err != nil {
		t.Fatal(err)
	}
	if rest.end == nil || rest.end.GetExitCode() != 0 {
		t.Fatalf("cat did not exit cleanly after CloseStdin: %v", rest.end)
	}

	// Without stdin the process reads EOF at once and input is refused.
	if r := e.run(&process.ProcessConfig{Cmd: "cat"}, ""); r.end.GetExitCode() != 0 || r.stdout.Len() != 0 {
		t.Fatalf("cat without stdin: %v %q", r.end, r.stdout.String())
	}
	ctx2, cancel := context.WithCancel(ctx)
	defer cancel()
	pid, _ = startBackground(t, e, ctx2, &process.StartRequest{Process: bashCmd("sleep 30"), Stdin: ptr(false)})
	defer e.proc.SendSignal(ctx, req(e, &process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}, ""))
	_, err = e.proc.SendInput(ctx, req(e, &process.SendInputRequest{
		Process: pidSel(pid),
		Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}},
	}, ""))
	if connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("input to a process without stdin: %v, want invalid_argument", err)
	}
}

func TestSendSignal(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pid, s := startBackground(t, e, ctx, &process.StartRequest{Process: bashCmd("sleep 30; echo not killed")})
	if _, err := e.proc.SendSignal(ctx, req(e, &process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGTERM}, "")); err != nil {
		t.Fatal(err)
	}
	r, err := drain(&result{pid: pid}, s)
	if err != nil {
		t.Fatal(err)
	}
	if r.end.GetExited() || r.end.GetExitCode() != -1 || r.end.GetStatus() != "signal: terminated" {
		t.Fatalf("end after SIGTERM = %v", r.end)
	}
	if r.stdout.Len() != 0 {
		t.Fatalf("the signal did not reach the whole job: %q", r.stdout.String())
	}
	_, err = e.proc.SendSignal(ctx, req(e, &process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}, ""))
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("signalling an ended process: %v, want not_found", err)
	}
}

func listed(t *testing.T, e *env) map[uint32]*process.ProcessInfo {
	t.Helper()
	res, err := e.proc.List(context.Background(), req(e, &process.ListRequest{}, ""))
	if err != nil {
		t.Fatal(err)
	}
	m := map[uint32]*process.ProcessInfo{}
	for _, p := range res.Msg.GetProcesses() {
		m[p.GetPid()] = p
	}
	return m
}

func TestListAndConnectToBackgroundProcess(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	startCtx, cancelStart := context.WithCancel(ctx)
	cfg := &process.ProcessConfig{Cmd: "cat", Envs: map[string]string{"K": "V"}}
	pid, _ := startBackground(t, e, startCtx, &process.StartRequest{Process: cfg, Tag: ptr("bg"), Stdin: ptr(true)})
	cancelStart() // the client goes away; the process must live on
	time.Sleep(300 * time.Millisecond)

	info := listed(t, e)[pid]
	if info == nil {
		t.Fatal("process died with its client")
	}
	if info.GetTag() != "bg" || info.GetConfig().GetCmd() != "cat" || info.GetConfig().GetEnvs()["K"] != "V" || info.GetConfig().GetCwd() != e.home {
		t.Fatalf("listed as %v", info)
	}

	// Two clients attach, one by tag and one by pid; both see the output.
	var streams []*connect.ServerStreamForClient[process.ConnectResponse]
	for _, sel := range []*process.ProcessSelector{{Selector: &process.ProcessSelector_Tag{Tag: "bg"}}, pidSel(pid)} {
		s, err := e.proc.Connect(ctx, req(e, &process.ConnectRequest{Process: sel}, ""))
		if err != nil {
			t.Fatal(err)
		}
		if !s.Receive() || s.Msg().GetEvent().GetStart().GetPid() != pid {
			t.Fatalf("connect: first event %v, err %v", s.Msg(), s.Err())
		}
		streams = append(streams, s)
	}
	if _, err := e.proc.SendInput(ctx, req(e, &process.SendInputRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "bg"}},
		Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("ping\n")}},
	}, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.CloseStdin(ctx, req(e, &process.CloseStdinRequest{Process: pidSel(pid)}, "")); err != nil {
		t.Fatal(err)
	}
	for i, s := range streams {
		r, err := drain(&result{pid: pid}, s)
		if err != nil {
			t.Fatal(err)
		}
		if r.stdout.String() != "ping\n" || r.end == nil || r.end.GetExitCode() != 0 {
			t.Fatalf("client %d saw %q, end %v", i, r.stdout.String(), r.end)
		}
	}
	waitFor(t, 2*time.Second, "process to leave the list", func() bool { return listed(t, e)[pid] == nil })

	_, err := e.proc.Connect(ctx, req(e, &process.ConnectRequest{Process: pidSel(pid)}, ""))
	if err == nil {
		s, _ := e.proc.Connect(ctx, req(e, &process.ConnectRequest{Process: pidSel(pid)}, ""))
		_, err = collect(s)
	}
	if connectCode(err) != connect.CodeNotFound {
		t.Fatalf("connecting to an ended process: %v, want not_found", err)
	}
}

func TestTimeoutKillsProcessButCancelDoesNot(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	// Connect-Timeout-Ms elapses: the stream ends with deadline_exceeded
	// and the process is killed.
	tctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	pid, s := startBackground(t, e, tctx, &process.StartRequest{Process: bashCmd("sleep 30")})
	_, err := drain(&result{pid: pid}, s)
	if c := connectCode(err); c != connect.CodeDeadlineExceeded {
		t.Fatalf("stream ended with %v, want deadline_exceeded", err)
	}
	waitFor(t, 3*time.Second, "timed-out process to be killed", func() bool { return listed(t, e)[pid] == nil })

	// The deadline bounds the process even after its client has left.
	r := connect.NewRequest(&process.StartRequest{Process: bashCmd("sleep 30")})
	r.Header().Set("Connect-Timeout-Ms", "1500")
	cctx, cancelClient := context.WithCancel(ctx)
	s2, err := e.proc.Start(cctx, r)
	if err != nil {
		t.Fatal(err)
	}
	if !s2.Receive() {
		t.Fatal(s2.Err())
	}
	pid2 := s2.Msg().GetEvent().GetStart().GetPid()
	cancelClient()
	time.Sleep(500 * time.Millisecond)
	if listed(t, e)[pid2] == nil {
		t.Fatal("process died when its client left, before its deadline")
	}
	waitFor(t, 3*time.Second, "process to be killed at its deadline", func() bool { return listed(t, e)[pid2] == nil })

	// A plain cancel leaves the process running.
	cctx, cancelClient = context.WithCancel(ctx)
	pid3, _ := startBackground(t, e, cctx, &process.StartRequest{Process: bashCmd("sleep 30")})
	cancelClient()
	time.Sleep(time.Second)
	if listed(t, e)[pid3] == nil {
		t.Fatal("cancelling the request killed the process")
	}
	if _, err := e.proc.SendSignal(ctx, req(e, &process.SendSignalRequest{Process: pidSel(pid3), Signal: process.Signal_SIGNAL_SIGKILL}, "")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "killed process to go", func() bool { return listed(t, e)[pid3] == nil })
}

func TestKeepalives(t *testing.T) {
	e := newEnv(t)
	r := req(e, &process.StartRequest{Process: bashCmd("sleep 2.5; echo done")}, "")
	r.Header().Set("Keepalive-Ping-Interval", "1")
	s, err := e.proc.Start(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	res, err := collect(s)
	if err != nil {
		t.Fatal(err)
	}
	if res.keepalives < 2 || res.stdout.String() != "done\n" {
		t.Fatalf("%d keepalives, stdout %q", res.keepalives, res.stdout.String())
	}
}

func TestPty(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pid, s := startBackground(t, e, ctx, &process.StartRequest{
		Process: bashCmd(`stty size; echo "term=$TERM"; read line; echo "got:$line"; stty size`),
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 30}},
	})
	r := &result{pid: pid}
	readUntil := func(want string) {
		t.Helper()
		for !strings.Contains(r.pty.String(), want) {
			if !s.Receive() {
				t.Fatalf("stream ended before %q; pty output %q: %v", want, r.pty.String(), s.Err())
			}
			_ = r.add(s.Msg().GetEvent())
		}
	}
	readUntil("term=xterm-256color")
	if !strings.Contains(r.pty.String(), "30 100") {
		t.Fatalf("initial size not applied: %q", r.pty.String())
	}
	if r.stdout.Len()+r.stderr.Len() != 0 {
		t.Fatal("pty output arrived as stdout/stderr")
	}
	if _, err := e.proc.Update(ctx, req(e, &process.UpdateRequest{Process: pidSel(pid), Pty: &process.PTY{Size: &process.PTY_Size{Cols: 120, Rows: 40}}}, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.proc.SendInput(ctx, req(e, &process.SendInputRequest{
		Process: pidSel(pid),
		Input:   &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("hello\n")}},
	}, "")); err != nil {
		t.Fatal(err)
	}
	rest, err := drain(&result{pid: pid}, s)
	if err != nil {
		t.Fatal(err)
	}
	out := r.pty.String() + rest.pty.String()
	if !strings.Contains(out, "got:hello") || !strings.Contains(out, "40 120") {
		t.Fatalf("pty output %q", out)
	}
	if rest.end.GetExitCode() != 0 {
		t.Fatalf("end %v", rest.end)
	}
}

func TestCloseStdinOfPtyIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pid, _ := startBackground(t, e, ctx, &process.StartRequest{Process: bashCmd("sleep 30"), Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}})
	defer e.proc.SendSignal(ctx, req(e, &process.SendSignalRequest{Process: pidSel(pid), Signal: process.Signal_SIGNAL_SIGKILL}, ""))
	_, err := e.proc.CloseStdin(ctx, req(e, &process.CloseStdinRequest{Process: pidSel(pid)}, ""))
	if connectCode(err) != connect.CodeInvalidArgument {
		t.Fatalf("CloseStdin on a pty: %v, want invalid_argument", err)
	}
}
