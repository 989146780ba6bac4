package envd_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd"
	"github.com/aenvhq/aenv/internal/envd/spec/filesystem/filesystemconnect"
	"github.com/aenvhq/aenv/internal/envd/spec/process"
	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
)

// testUID and testGID are what the fake "user" maps to: nobody when the
// tests run as root (so that switching users is exercised), else the
// current user.
func testIDs() (uid, gid int) {
	if os.Geteuid() == 0 {
		return 65534, 65534
	}
	return os.Getuid(), os.Getgid()
}

// supplementaryGID is a group the fake "user" is a member of.
const supplementaryGID = 4242

type env struct {
	t       testing.TB
	srv     *envd.Server
	ts      *httptest.Server
	home    string // the fake user's home
	token   string
	proc    processconnect.ProcessClient
	fs      filesystemconnect.FilesystemClient
	baseURL string
}

type envOption func(*envd.Options)

// newEnv starts envd in-process on an HTTP/1.1 test server, with a fake
// passwd whose "user" has its home in a temporary directory.
func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("envd runs only on Linux")
	}
	root := t.TempDir()
	// t.TempDir makes <tmp>/<TestName><n>/<seq>, both 0700; the
	// unprivileged user must be able to reach its home below them.
	for _, d := range []string{root, filepath.Dir(root)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	etc := filepath.Join(root, "etc")
	home := filepath.Join(root, "home", "user")
	for _, d := range []string{etc, home} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	uid, gid := testIDs()
	if os.Geteuid() == 0 {
		if err := os.Chown(home, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/bin/bash\nuser:x:%d:%d:Test User:%s:/bin/bash\n", uid, gid, home)
	group := fmt.Sprintf("root:x:0:\nusers:x:%d:\ntestgrp:x:%d:user\n", gid, supplementaryGID)
	if gid == 0 {
		group = fmt.Sprintf("root:x:0:\ntestgrp:x:%d:user\n", supplementaryGID)
	}
	for name, content := range map[string]string{"passwd": passwd, "group": group} {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o := envd.Options{
		Logger:  slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		EtcDir:  etc,
		BaseEnv: append(os.Environ(), envd.AccessTokenEnv+"=leaked"),
		// The tests play the node from loopback.
		InitFrom: func(netip.Addr) bool { return true },
	}
	for _, opt := range opts {
		opt(&o)
	}
	srv, err := envd.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ts.Close()
		srv.Close()
	})
	e := &env{t: t, srv: srv, ts: ts, home: home, token: o.AccessToken, baseURL: ts.URL}
	e.proc = processconnect.NewProcessClient(ts.Client(), ts.URL, connect.WithProtoJSON())
	e.fs = filesystemconnect.NewFilesystemClient(ts.Client(), ts.URL, connect.WithProtoJSON())
	return e
}

// testWriter sends server logs to the test log, and nowhere once the test
// is over (processes may outlive it).
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	defer func() { _ = recover() }()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func withToken(tok string) envOption { return func(o *envd.Options) { o.AccessToken = tok } }

// req wraps a message with the headers the SDK sends.
func req[T any](e *env, msg *T, user string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if e.token != "" {
		r.Header().Set("X-Access-Token", e.token)
	}
	if user != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	return r
}

func bashCmd(script string) *process.ProcessConfig {
	return &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}
}

func ptr[T any](v T) *T { return &v }

// result is what a process stream carried.
type result struct {
	pid        uint32
	stdout     bytes.Buffer
	stderr     bytes.Buffer
	pty        bytes.Buffer
	end        *process.ProcessEvent_EndEvent
	keepalives int
	firstData  time.Time
}

type eventStream interface {
	Receive() bool
	Err() error
	Close() error
}

// collect reads a Start or Connect stream to its end.
func collect[T interface{ GetEvent() *process.ProcessEvent }](s interface {
	eventStream
	Msg() T
}) (*result, error) {
	return drain(&result{}, s)
}

// drain adds the rest of a stream to r.
func drain[T interface{ GetEvent() *process.ProcessEvent }](r *result, s interface {
	eventStream
	Msg() T
}) (*result, error) {
	for s.Receive() {
		if err := r.add(s.Msg().GetEvent()); err != nil {
			return r, err
		}
	}
	return r, s.Err()
}

func (r *result) add(ev *process.ProcessEvent) error {
	switch e := ev.GetEvent().(type) {
	case *process.ProcessEvent_Start:
		if r.pid != 0 {
			return errors.New("second start event")
		}
		r.pid = e.Start.GetPid()
	case *process.ProcessEvent_Data:
		if r.pid == 0 {
			return errors.New("data before start")
		}
		if r.firstData.IsZero() {
			r.firstData = time.Now()
		}
		r.stdout.Write(e.Data.GetStdout())
		r.stderr.Write(e.Data.GetStderr())
		r.pty.Write(e.Data.GetPty())
	case *process.ProcessEvent_End:
		r.end = e.End
	case *process.ProcessEvent_Keepalive:
		r.keepalives++
	}
	return nil
}

// run starts a command and waits for its end.
func (e *env) run(cfg *process.ProcessConfig, user string) *result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := e.proc.Start(ctx, req(e, &process.StartRequest{Process: cfg, Stdin: ptr(false)}, user))
	if err != nil {
		e.t.Fatal(err)
	}
	r, err := collect(s)
	if err != nil {
		e.t.Fatalf("running %v: %v", cfg.GetArgs(), err)
	}
	if r.end == nil {
		e.t.Fatalf("running %v: no end event", cfg.GetArgs())
	}
	return r
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// httpDo sends a plain HTTP request with the access token (if any).
func (e *env) httpDo(method, path string, body io.Reader, hdr map[string]string) (*http.Response, []byte) {
	e.t.Helper()
	r, err := http.NewRequest(method, e.baseURL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if e.token != "" {
		r.Header.Set("X-Access-Token", e.token)
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	res, err := e.ts.Client().Do(r)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return res, b
}

func connectCode(err error) connect.Code {
	if err == nil {
		return 0
	}
	return connect.CodeOf(err)
}
