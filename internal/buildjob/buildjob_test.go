package buildjob

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// TestMain fails the tests if a goroutine outlives them: Jobs owns and
// waits for every build it follows.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeNode answers Build with lines, then result (or err), or blocks
// until its context ends when block is set.
type fakeNode struct {
	nodeapi.Node // only ID, Build and PutBuildContext are called
	id           string
	lines        []string
	result       *nodev1.BuildResult
	err          error
	block        bool
	started      chan struct{}

	mu       sync.Mutex
	req      *nodev1.BuildRequest
	contexts map[string][]byte
}

func (n *fakeNode) ID() string { return n.id }

func (n *fakeNode) PutBuildContext(ctx context.Context, r *nodev1.PutBuildContextRequest) (*nodev1.PutBuildContextResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.contexts == nil {
		n.contexts = map[string][]byte{}
	}
	if int64(len(n.contexts[r.Name])) != r.Offset {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("out of order"))
	}
	n.contexts[r.Name] = append(n.contexts[r.Name], r.Data...)
	return &nodev1.PutBuildContextResponse{}, nil
}

func (n *fakeNode) Build(ctx context.Context, r *nodev1.BuildRequest, fn func(*nodev1.BuildEvent)) error {
	n.mu.Lock()
	n.req = r
	n.mu.Unlock()
	if n.started != nil {
		close(n.started)
	}
	if len(n.lines) > 0 {
		fn(&nodev1.BuildEvent{Lines: n.lines})
	}
	if n.block {
		<-ctx.Done()
		return connect.NewError(connect.CodeCanceled, ctx.Err())
	}
	if n.err != nil {
		return n.err
	}
	fn(&nodev1.BuildEvent{Result: n.result})
	return nil
}

func open(t *testing.T, st state.Store, server string, n nodeapi.Node) *Jobs {
	t.Helper()
	j, err := Open(context.Background(), Config{
		State: st, Server: server,
		Node: func(context.Context) (nodeapi.Node, error) {
			if n == nil {
				return nil, errors.New("no node")
			}
			return n, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func request(t *testing.T, j *Jobs, tpl, build string) {
	t.Helper()
	if _, err := j.Request(context.Background(), Record{TemplateID: tpl, BuildID: build, Team: "t", Names: []string{tpl}}); err != nil {
		t.Fatal(err)
	}
}

var simple = Spec{Dockerfile: &buildspec.Dockerfile{From: "base", FromKind: buildspec.FromTemplate,
	Steps: []buildspec.Step{{Kind: buildspec.StepRun, Args: []string{"true"}, Shell: true}}}}

// TestBuildSeenFromAnotherServer: a build one server runs on a node is
// followed, with its whole log and its outcome, through another server's
// Jobs on the same state; the node got the build as specified.
func TestBuildSeenFromAnotherServer(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	n := &fakeNode{id: "n1", lines: []string{"Step 0/1 : FROM base", "Step 1/1 : RUN true", "hello"},
		result: &nodev1.BuildResult{FailedStep: -1, TemplateId: "tpl"}}
	a, b := open(t, st, "a", n), open(t, st, "b", nil)
	defer a.Close(context.Background())
	defer b.Close(context.Background())
	request(t, a, "tpl", "b1")
	if err := a.Start(context.Background(), "tpl", "b1", simple); err != nil {
		t.Fatal(err)
	}
	if err := a.Start(context.Background(), "tpl", "b1", simple); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start: %v, want ErrStarted", err)
	}
	var got []string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec, err := b.Follow(ctx, "tpl", "b1", 0, func(es []Entry) {
		for _, e := range es {
			got = append(got, e.Message)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != Ready || rec.Node != "n1" || rec.Server != "a" {
		t.Fatalf("record %+v, want ready on n1 by a", rec)
	}
	if strings.Join(got, "|") != strings.Join(n.lines, "|") {
		t.Fatalf("followed log %q, want %q", got, n.lines)
	}
	if n.req.Template.Id != "tpl" || len(n.req.Steps) != 1 || n.req.Steps[0].Args[0] != "true" || n.req.FromKind != int32(buildspec.FromTemplate) {
		t.Fatalf("node got %v", n.req)
	}
	// Offsets count from the first line.
	es, first, err := b.Logs(context.Background(), "b1", 2, 1)
	if err != nil || len(es) != 1 || es[0].Message != "hello" || first != 2 {
		t.Fatalf("Logs(2, 1) = %v, %d, %v", es, first, err)
	}
	if _, err := b.Lookup(context.Background(), "tpl", "other"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Lookup of another build id: %v, want ErrNotFound", err)
	}
}

// TestFailedBuildReason: a step that fails on the node ends the build in
// error with that step and the log's last entries, the error last.
func TestFailedBuildReason(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	n := &fakeNode{id: "n1", lines: []string{"Step 1/2 : RUN false"},
		result: &nodev1.BuildResult{FailedStep: 2, Error: "step 2/2 RUN false: exited with code 1"}}
	a := open(t, st, "a", n)
	defer a.Close(context.Background())
	request(t, a, "tpl", "b1")
	done := make(chan *Record, 1)
	spec := simple
	spec.Done = func(r *Record) { done <- r }
	if err := a.Start(context.Background(), "tpl", "b1", spec); err != nil {
		t.Fatal(err)
	}
	rec := <-done
	if rec.Status != Error || rec.Reason == nil || rec.Reason.Step != "2" || !strings.Contains(rec.Reason.Message, "exited with code 1") {
		t.Fatalf("record %+v reason %+v", rec, rec.Reason)
	}
	last := rec.Reason.LogEntries[len(rec.Reason.LogEntries)-1]
	if last.Level != "error" || !strings.Contains(last.Message, "exited with code 1") || rec.Reason.LogEntries[0].Message != "Step 1/2 : RUN false" {
		t.Fatalf("reason's entries %+v", rec.Reason.LogEntries)
	}
}

// TestNodeGoneFailsBuild: a stream that breaks fails the build, naming
// the node.
func TestNodeGoneFailsBuild(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	n := &fakeNode{id: "n1", err: connect.NewError(connect.CodeUnavailable, errors.New("connection reset"))}
	a := open(t, st, "a", n)
	defer a.Close(context.Background())
	request(t, a, "tpl", "b1")
	done := make(chan *Record, 1)
	spec := simple
	spec.Done = func(r *Record) { done <- r }
	if err := a.Start(context.Background(), "tpl", "b1", spec); err != nil {
		t.Fatal(err)
	}
	rec := <-done
	if rec.Status != Error || !strings.Contains(rec.Reason.Message, "node n1") || !strings.Contains(rec.Reason.Message, "went away") {
		t.Fatalf("record %+v reason %+v", rec, rec.Reason)
	}
}

// TestCloseFailsRunningBuild: closing the server that runs a build
// cancels it on the node and records why; a new request of the template
// is then accepted, while one during the build was refused.
func TestCloseFailsRunningBuild(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	n := &fakeNode{id: "n1", lines: []string{"working"}, block: true, started: make(chan struct{})}
	a, b := open(t, st, "a", n), open(t, st, "b", nil)
	defer b.Close(context.Background())
	request(t, a, "tpl", "b1")
	if err := a.Start(context.Background(), "tpl", "b1", simple); err != nil {
		t.Fatal(err)
	}
	<-n.started
	if _, err := b.Request(context.Background(), Record{TemplateID: "tpl", BuildID: "b2"}); !errors.Is(err, ErrBusy) {
		t.Fatalf("request during the build: %v, want ErrBusy", err)
	}
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	rec, err := b.Lookup(context.Background(), "tpl", "b1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != Error || !strings.Contains(rec.Reason.Message, "stopped") {
		t.Fatalf("after Close: %+v %+v", rec, rec.Reason)
	}
	request(t, b, "tpl", "b2")
	if es, _, _ := b.Logs(context.Background(), "b1", 0, -1); len(es) != 0 {
		t.Fatalf("the replaced build's log is still there: %v", es)
	}
}

// putRecord writes r as a running build, as a server that died would
// have left it.
func putRecord(t *testing.T, st state.Store, r Record) {
	t.Helper()
	r.Status = Building
	val, _ := json.Marshal(r)
	if _, err := st.Put(context.Background(), recordKey(r.TemplateID), val, state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestRestartFailsLeftovers: a server that starts again fails the builds
// its earlier run left running; builds of a server that is gone are
// failed by any other server that reads them; a live server's are not.
func TestRestartFailsLeftovers(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	putRecord(t, st, Record{TemplateID: "mine", BuildID: "b1", Server: "a"})
	putRecord(t, st, Record{TemplateID: "gone", BuildID: "b2", Server: "z"})
	b := open(t, st, "b", nil)
	defer b.Close(context.Background())
	putRecord(t, st, Record{TemplateID: "live", BuildID: "b3", Server: "b"})
	a := open(t, st, "a", nil)
	defer a.Close(context.Background())
	rec, err := b.Get(context.Background(), "mine")
	if err != nil || rec.Status != Error || !strings.Contains(rec.Reason.Message, "restarted") {
		t.Fatalf("the restarted server's build: %+v, %v", rec, err)
	}
	rec, err = a.Get(context.Background(), "gone")
	if err != nil || rec.Status != Error || !strings.Contains(rec.Reason.Message, "is gone") {
		t.Fatalf("the gone server's build: %+v, %v", rec, err)
	}
	if rec, err := a.Get(context.Background(), "live"); err != nil || rec.Status != Building {
		t.Fatalf("the live server's build: %+v, %v", rec, err)
	}
}

// TestLogTailBounded: a long log keeps about its last maxLogBytes; a poll
// from an offset dropped gets the tail from its start, and offsets still
// count from the build's first line.
func TestLogTailBounded(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	ctx := context.Background()
	w := newLogWriter(st, "b1")
	line := strings.Repeat("x", 1000)
	const total = 3000 // ~3 MB
	for i := range total {
		w.add(ctx, "info", fmt.Sprintf("%05d %s", i, line))
	}
	if err := w.flush(ctx); err != nil {
		t.Fatal(err)
	}
	j := &Jobs{cfg: Config{State: st}}
	es, first, err := j.Logs(ctx, "b1", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	bytes := 0
	for _, e := range es {
		bytes += len(e.Message)
	}
	if bytes > maxLogBytes || bytes < maxLogBytes-2*chunkBytes {
		t.Fatalf("kept %d bytes of log, want about %d", bytes, maxLogBytes)
	}
	if first == 0 || first+len(es) != total || !strings.HasPrefix(es[0].Message, fmt.Sprintf("%05d ", first)) {
		t.Fatalf("tail starts at %d (%q) with %d entries", first, es[0].Message[:6], len(es))
	}
	es, got, _ := j.Logs(ctx, "b1", total-5, 2)
	if got != total-5 || len(es) != 2 || !strings.HasPrefix(es[0].Message, fmt.Sprintf("%05d ", total-5)) {
		t.Fatalf("Logs(total-5, 2) starts at %d: %d entries", got, len(es))
	}
	es, got, _ = j.Logs(ctx, "b1", total+10, -1)
	if len(es) != 0 || got != total+10 {
		t.Fatalf("Logs past the end: %d entries from %d", len(es), got)
	}
}

// TestContextsSent: a build's files reach the node before the build, in
// order, whole.
func TestContextsSent(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	dir := t.TempDir()
	big := strings.Repeat("0123456789", 300_000) // 3 MB: several chunks
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	n := &fakeNode{id: "n1", result: &nodev1.BuildResult{FailedStep: -1}}
	a := open(t, st, "a", n)
	defer a.Close(context.Background())
	request(t, a, "tpl", "b1")
	done := make(chan *Record, 1)
	spec := simple
	spec.Contexts, spec.Context = map[string]string{"ctx": dir}, "ctx"
	spec.Done = func(r *Record) { done <- r }
	if err := a.Start(context.Background(), "tpl", "b1", spec); err != nil {
		t.Fatal(err)
	}
	if rec := <-done; rec.Status != Ready {
		t.Fatalf("build: %+v %+v", rec, rec.Reason)
	}
	out := filepath.Join(t.TempDir(), "out")
	n.mu.Lock()
	tarred := n.contexts["ctx"]
	n.mu.Unlock()
	if err := buildspec.UnpackContext(strings.NewReader(string(tarred)), out); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(out, "f")); string(got) != big {
		t.Fatalf("the node got %d bytes of f, want %d", len(got), len(big))
	}
	if n.req.Context != "ctx" {
		t.Fatalf("the build names context %q", n.req.Context)
	}
}

// TestSweepExpires: finished builds past retention and builds never
// started go, with their logs; others stay.
func TestSweepExpires(t *testing.T) {
	st := state.NewMemory()
	defer st.Close()
	a := open(t, st, "a", nil)
	defer a.Close(context.Background())
	ctx := context.Background()
	request(t, a, "waiting", "b1")
	old := Record{TemplateID: "old", BuildID: "b2", Status: Ready, Finished: time.Now().Add(-8 * 24 * time.Hour)}
	val, _ := json.Marshal(old)
	st.Put(ctx, recordKey("old"), val, state.WriteOptions{})
	st.Put(ctx, chunkKey("b2", 0), []byte(`[{"message":"x"}]`), state.WriteOptions{})
	recent := Record{TemplateID: "recent", BuildID: "b3", Status: Error, Finished: time.Now()}
	val, _ = json.Marshal(recent)
	st.Put(ctx, recordKey("recent"), val, state.WriteOptions{})

	if err := a.Sweep(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, "old"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expired build: %v", err)
	}
	if es, _, _ := a.Logs(ctx, "b2", 0, -1); len(es) != 0 {
		t.Fatalf("expired build's log stayed")
	}
	for _, id := range []string{"recent", "waiting"} {
		if _, err := a.Get(ctx, id); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	if err := a.Sweep(ctx, time.Now().Add(25*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, "waiting"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a build never started, a day on: %v", err)
	}
}
