package state_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/state/statetest"
	"github.com/aenvhq/aenv/internal/testutil"
)

// memberEnv makes the test binary, re-executed, run an etcd member
// instead of tests: an external etcd in its own process, which a test can
// kill, without needing an etcd binary on the machine.
const memberEnv = "AENV_STATE_TEST_MEMBER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMemberProcess(spec))
	}
	os.Exit(m.Run())
}

func runMemberProcess(spec string) int {
	var mc state.MemberConfig
	if err := json.Unmarshal([]byte(spec), &mc); err != nil {
		fmt.Fprintln(os.Stderr, "parsing member config:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := state.RunMember(ctx, mc, log); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// quiet drops logs: etcd's few errors at shutdown are expected in tests.
func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// shortDir is a temp dir with a path short enough for unix sockets,
// which t.TempDir's long names under $TMPDIR may not be.
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("/tmp", "aenv-st-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

type member struct {
	endpoint string
	cmd      *exec.Cmd
	out      *testutil.SyncBuffer
	exited   <-chan struct{}
}

// startMember runs an etcd member in a child process on free loopback
// ports. The child dies with the test (Pdeathsig) and in t.Cleanup.
func startMember(t *testing.T) *member {
	t.Helper()
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	spec, err := json.Marshal(state.MemberConfig{
		Name:       "ext",
		DataDir:    t.TempDir(),
		ClientURLs: []string{client},
		PeerURLs:   []string{peer},
		NewCluster: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	m := &member{endpoint: client, out: &testutil.SyncBuffer{}}
	m.cmd = exec.Command(os.Args[0], "-test.run=^$")
	m.cmd.Env = append(os.Environ(), memberEnv+"="+string(spec))
	m.cmd.Stdout, m.cmd.Stderr = m.out, m.out
	if m.exited, err = testutil.StartTied(m.cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.stop(t)
		if t.Failed() {
			t.Logf("member output:\n%s", m.out.String())
		}
	})
	return m
}

// stop ends the member gracefully, or kills it after a while.
func (m *member) stop(t *testing.T) {
	m.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		t.Log("etcd member did not stop on SIGTERM; killing it")
		m.cmd.Process.Kill()
		<-m.exited
	}
}

func openEtcd(t testing.TB, cfg state.Config) *state.Etcd {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e, err := state.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return e
}

func openEmbedded(t testing.TB) *state.Etcd {
	t.Helper()
	return openEtcd(t, state.Config{DataDir: t.TempDir(), SocketDir: shortDir(t)})
}

// clientsOf opens, for each subtest, a client of endpoints with a key
// prefix of its own: one member serves the whole suite, as one etcd
// serves several aenv clusters.
func clientsOf(endpoints []string) func(t *testing.T) state.Store {
	return func(t *testing.T) state.Store {
		return openEtcd(t, state.Config{
			Endpoints: endpoints,
			Prefix:    "/t/" + strings.ReplaceAll(t.Name(), "/", "_") + "/",
		})
	}
}

func TestMemory(t *testing.T) {
	statetest.Run(t, func(t *testing.T) state.Store {
		st := state.NewMemory()
		t.Cleanup(func() { st.Close() })
		return st
	})
}

func TestEtcdEmbedded(t *testing.T) {
	root := openEmbedded(t)
	statetest.Run(t, clientsOf(root.Endpoints()))
}

func TestEtcdExternal(t *testing.T) {
	m := startMember(t)
	statetest.Run(t, clientsOf([]string{m.endpoint}))
}
