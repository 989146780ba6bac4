package cli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/server"
	"github.com/aenvhq/aenv/internal/testutil"
)

// shared is the one real server (gVisor, netns, envd) the tests of this
// package share, started by the first test that needs it and closed by
// TestMain.
var shared struct {
	once sync.Once
	dir  string
	srv  *server.Server
	err  error

	binOnce sync.Once
	bin     string
	binErr  error
	// home is HOME before tests replace it: go build finds its caches
	// there.
	home string
}

func TestMain(m *testing.M) {
	shared.home = os.Getenv("HOME")
	code := m.Run()
	if shared.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if err := shared.srv.Close(ctx); err != nil {
			// Keep the state directory: it names what is left behind.
			fmt.Fprintf(os.Stderr, "closing the test server (state in %s): %v\n", shared.dir, err)
			code = 1
			shared.dir = ""
		}
		cancel()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	if shared.bin != "" {
		os.RemoveAll(filepath.Dir(shared.bin))
	}
	os.Exit(code)
}

// testEnv is a running server and a way to run the CLI against it.
type testEnv struct {
	url, key string
	// keyFile holds key, for --key-file.
	keyFile string
	c       *client.Client
}

// startServer returns the shared server, starting it on first use. It
// needs root, runsc, AENV_BASE_ROOTFS and AENV_BIN_DIR (for envd).
func startServer(t *testing.T) *testEnv {
	t.Helper()
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	base := os.Getenv("AENV_BASE_ROOTFS")
	if base == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS not set (make base builds it)")
	}
	binDir := os.Getenv("AENV_BIN_DIR")
	if binDir == "" {
		testutil.Unavailable(t, "AENV_BIN_DIR not set (make build puts envd there)")
	}
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "aenv-cli-test-")
		if shared.err != nil {
			return
		}
		level := slog.LevelWarn
		if testing.Verbose() {
			level = slog.LevelInfo
		}
		shared.srv, shared.err = server.Start(context.Background(), server.Config{Config: agent.Config{
			Listen:        "127.0.0.1:0",
			DataDir:       filepath.Join(shared.dir, "data"),
			RunDir:        filepath.Join(shared.dir, "run"),
			RunscPath:     runsc,
			EnvdPath:      filepath.Join(binDir, "envd"),
			BaseRootFS:    base,
			SandboxCIDR:   "10.252.0.0/16",
			NetnsTag:      "clit",
			NetnsPoolSize: 2,
			WarmPoolFloor: 1,
			OnStop:        membership.StopKill,
			Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		}})
	})
	if shared.err != nil {
		t.Fatalf("starting the test server: %v", shared.err)
	}
	e := &testEnv{url: "http://" + shared.srv.Addr().String(), key: shared.srv.APIKey(), keyFile: server.APIKeyPath(filepath.Join(shared.dir, "data"))}
	e.c = client.New(e.url, e.key)
	return e
}

// withKey is a testEnv for the server at url with key, in a file for
// --key-file.
func withKey(t *testing.T, url, key string) *testEnv {
	t.Helper()
	f := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(f, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return &testEnv{url: url, key: key, keyFile: f}
}

// aenvBinary builds cmd/aenv once, for the tests that need a real process
// (a terminal, exit codes as the shell sees them).
func aenvBinary(t *testing.T) string {
	t.Helper()
	goBin := testutil.RequireBinary(t, "go", "")
	shared.binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "aenv-cli-bin-")
		if err != nil {
			shared.binErr = err
			return
		}
		shared.bin = filepath.Join(dir, "aenv")
		build := exec.Command(goBin, "build", "-o", shared.bin, "github.com/aenvhq/aenv/cmd/aenv")
		build.Env = append(os.Environ(), "HOME="+shared.home)
		out, err := build.CombinedOutput()
		if err != nil {
			shared.binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if shared.binErr != nil {
		t.Fatal(shared.binErr)
	}
	return shared.bin
}

// result is one run of the CLI.
type result struct {
	code           int
	stdout, stderr string
}

// run runs the CLI in-process against e (e nil: no --url/--key), with
// stdin as its input, and reports what main would: the exit code and
// "aenv: <err>" on stderr.
func (e *testEnv) run(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return e.runWith(t, strings.NewReader(stdin), &syncBuffer{}, args...)
}

func (e *testEnv) runWith(t *testing.T, stdin *strings.Reader, stdout *syncBuffer, args ...string) result {
	t.Helper()
	if e != nil {
		args = append([]string{"--url", e.url, "--key-file", e.keyFile}, args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stderr syncBuffer
	code, err := RunWith(ctx, args, Options{Stdin: stdin, Stdout: stdout, Stderr: &stderr})
	if err != nil {
		fmt.Fprintln(&stderr, "aenv:", err)
		if code == 0 {
			code = 1
		}
	}
	r := result{code: code, stdout: stdout.String(), stderr: stderr.String()}
	if testing.Verbose() {
		t.Logf("aenv %s -> %d\nstdout: %q\nstderr: %q", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// mustRun runs the CLI and fails the test unless it exits 0.
func (e *testEnv) mustRun(t *testing.T, args ...string) string {
	t.Helper()
	r := e.run(t, "", args...)
	if r.code != 0 {
		t.Fatalf("aenv %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
	}
	return r.stdout
}

// create makes a sandbox through the CLI and kills it when the test ends.
func (e *testEnv) create(t *testing.T, args ...string) string {
	t.Helper()
	id := strings.TrimSpace(e.mustRun(t, append([]string{"create"}, args...)...))
	if id == "" {
		t.Fatal("create printed no id")
	}
	t.Cleanup(func() { _ = e.c.Kill(context.Background(), id) })
	return id
}

// exists reports whether the server knows sandbox id.
func (e *testEnv) exists(t *testing.T, id string) bool {
	t.Helper()
	_, err := e.c.Get(context.Background(), id)
	if client.IsStatus(err, 404) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

// syncBuffer is a bytes.Buffer that may be read while it is written.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
	// onWrite, if set, is called after each write with everything so far.
	onWrite func(string)
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	n, err := s.b.Write(p)
	all := s.b.String()
	f := s.onWrite
	s.mu.Unlock()
	if f != nil {
		f(all)
	}
	return n, err
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// oneErrorLine checks that stderr is exactly one line, "aenv: ...",
// containing want, with no stack or usage dump.
func oneErrorLine(t *testing.T, r result, want string) {
	t.Helper()
	if r.code == 0 {
		t.Fatalf("exit 0, want failure (stdout %q)", r.stdout)
	}
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "aenv: ") {
		t.Fatalf("stderr is not one 'aenv: ' line: %q", r.stderr)
	}
	if !strings.Contains(lines[0], want) {
		t.Fatalf("error %q does not mention %q", lines[0], want)
	}
	for _, bad := range []string{"goroutine ", "panic", "Usage:", "Flags:"} {
		if strings.Contains(r.stderr, bad) {
			t.Fatalf("error output contains %q: %q", bad, r.stderr)
		}
	}
}
