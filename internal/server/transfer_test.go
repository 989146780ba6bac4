package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/template/erofs"
	"github.com/aenvhq/aenv/internal/testutil"
)

// exportCutter cuts the first ExportSnapshot stream of the nodes it
// wraps once cutAfter bytes of chunks went through, as a connection that
// drops midway, and records where each export started.
type exportCutter struct {
	cutAfter int64

	mu   sync.Mutex
	cuts int
	// passed is what went through before the cut.
	passed int64
	// offsets are the bytes the receiver had, per export.
	offsets []int64
}

func (c *exportCutter) record() (cuts int, passed int64, offsets []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cuts, c.passed, append([]int64(nil), c.offsets...)
}

// cuttingNode is a node whose exports an exportCutter cuts.
type cuttingNode struct {
	nodeapi.Node
	c *exportCutter
}

func (n *cuttingNode) ExportSnapshot(ctx context.Context, req *nodev1.ExportSnapshotRequest, fn func(*nodev1.SnapshotPart) error) error {
	var had int64
	for _, off := range req.Offsets {
		had += off
	}
	c := n.c
	c.mu.Lock()
	c.offsets = append(c.offsets, had)
	cut := c.cuts == 0
	c.mu.Unlock()
	var passed int64
	errCut := nodeapi.NewError(connect.CodeUnavailable, errors.New("the test cut the stream"))
	return n.Node.ExportSnapshot(ctx, req, func(p *nodev1.SnapshotPart) error {
		if cut && passed+int64(len(p.Data)) > c.cutAfter {
			c.mu.Lock()
			c.cuts++
			c.passed = passed
			c.mu.Unlock()
			return errCut
		}
		passed += int64(len(p.Data))
		return fn(p)
	})
}

// movedSandbox checks that sandbox id, running busyboxCounter, carries
// on after a move: its counter went on from where it was (its memory came
// along), and check prints want (its files did).
type movedSandbox struct {
	t           *testing.T
	c           *client.Client
	id          string
	check, want string
}

// count reads the counter, when says at which point of the test.
func (m movedSandbox) count(when string) int {
	m.t.Helper()
	n, err := strconv.Atoi(runWithin(m.t, m.c, m.id, "cat /tmp/counter", 30*time.Second))
	if err != nil {
		m.t.Fatalf("reading the counter %s: %v", when, err)
	}
	return n
}

// carriesOn checks the counter went past before, and the files, and
// returns the counter. It waits for the count to move rather than for a
// fixed time: a sandbox just restored on a loaded host (CI) can take
// longer than a few of the loop's 50 ms turns to fault its pages back
// in, and a lost loop never moves however long the wait.
func (m movedSandbox) carriesOn(when string, before int) int {
	m.t.Helper()
	start := time.Now()
	deadline := start.Add(15 * time.Second)
	after := m.count(when)
	for after <= before && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		after = m.count(when)
	}
	if after <= before {
		m.t.Fatalf("%s the counter went from %d to %d in %v: the sandbox's memory did not come along", when, before, after, time.Since(start).Round(time.Millisecond))
	}
	m.t.Logf("%s the counter went from %d to %d within %v", when, before, after, time.Since(start).Round(time.Millisecond))
	if got := runWithin(m.t, m.c, m.id, m.check, 20*time.Second); got != m.want {
		m.t.Fatalf("%s its files: %q", when, got)
	}
	return after
}

// busyboxCounter starts, in a sandbox of the busybox template, a
// background count in a shell's memory written to /tmp/counter: were its
// memory lost, the count would stop.
const busyboxCounter = `i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.tmp; mv /tmp/counter.tmp /tmp/counter; sleep 0.05; done >/dev/null 2>&1 &
sleep 0.3`

// TestMoveWithoutStore: two nodes, the server's own and an agent, share
// no store. A sandbox of a template only the server's node has (made
// there, a block image) migrates to the agent: the snapshot and the
// template go over the node API, and its processes and files carry on.
// Paused there and resumed on the server's node (the agent draining),
// it comes back through a relay the test cuts midway, which resumes from
// what arrived. Paused on the agent again, once the agent is gone, a
// resume is a 409 that names the sandbox and says why.
func TestMoveWithoutStore(t *testing.T) {
	busybox := testutil.RequireBinary(t, "busybox", "")
	cutter := &exportCutter{cutAfter: 1 << 20}
	srv, c, nodeAgent := startAgent(t, "mvst", agentSetup{localNode: true, noStore: true,
		wrapNode: func(n nodeapi.Node) nodeapi.Node { return &cuttingNode{Node: n, c: cutter} }})
	ctx := context.Background()
	local, remote := "mvsta", "mvstb"

	// A template of the server's node alone: the agent has no store to
	// fetch it from.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	ts, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(srv.cfg.DataDir, "templates"), Blocks: erofs.Images{}, Logger: log})
	must(t, err)
	st, err := ts.NewStage("tinymove")
	must(t, err)
	root := st.RootFS()
	for _, d := range []string{"bin", "etc", "home/user", "tmp"} {
		must(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	bb, err := os.ReadFile(busybox)
	must(t, err)
	must(t, os.WriteFile(filepath.Join(root, "bin/busybox"), bb, 0o755))
	for _, applet := range []string{"sh", "cat", "echo", "mv", "sleep"} {
		must(t, os.Symlink("busybox", filepath.Join(root, "bin", applet)))
	}
	must(t, os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "etc/marker"), []byte("from the server's node"), 0o644))
	must(t, os.Chown(filepath.Join(root, "home/user"), 1000, 1000))
	must(t, st.Commit(&template.Template{ID: "tinymove", CPUCount: 1, MemoryMB: 256,
		Image: &template.ImageConfig{Env: []string{"PATH=/bin"}}}))

	// Placed where the template is, once that node reports it.
	var sb *client.Sandbox
	deadline := time.Now().Add(20 * time.Second)
	for {
		sb, err = c.Create(ctx, client.CreateOptions{TemplateID: "tinymove", Timeout: 300})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("creating a sandbox of the server node's template: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Cleanup(func() { c.Kill(context.Background(), sb.SandboxID) })
	id := sb.SandboxID
	if info, err := c.Get(ctx, id); err != nil || info.NodeID != local {
		t.Fatalf("placed on %+v %v, want %s", info, err, local)
	}
	runWithin(t, c, id, "echo kept > /home/user/state.txt && "+busyboxCounter, 20*time.Second)
	moved := movedSandbox{t: t, c: c, id: id, check: "cat /home/user/state.txt /etc/marker", want: "kept\nfrom the server's node"}
	before := moved.count("before the migration")

	// Migrated: the snapshot and the template go to the agent.
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	m, err := c.Migrate(mctx, id, remote)
	cancel()
	if err != nil {
		t.Fatalf("migrating without a store: %v", err)
	}
	if m.NodeID != remote || m.FromNodeID != local {
		t.Fatalf("migration: %+v", m)
	}
	// Its template's marker, read there, says the template came along.
	before = moved.carriesOn("after the migration", before)

	// Paused on the agent, resumed on the server's node through a relay
	// cut midway.
	must(t, c.Pause(ctx, id))
	if _, err := c.Drain(ctx, remote, true); err != nil {
		t.Fatal(err)
	}
	got, resumed, err := c.Connect(ctx, id, 5*time.Minute)
	if err != nil || !resumed || got.NodeID != local {
		t.Fatalf("resuming on the other node: %+v resumed=%v %v", got, resumed, err)
	}
	cuts, passed, offsets := cutter.record()
	if cuts != 1 || len(offsets) != 2 || offsets[0] != 0 || passed == 0 || offsets[1] != passed {
		t.Fatalf("exports from the agent: %d cuts after %d bytes, starting at %v bytes; want one cut, then a resume from what went through",
			cuts, passed, offsets)
	}
	before = moved.carriesOn("after the resume elsewhere", before)
	if _, err := c.Drain(ctx, remote, false); err != nil {
		t.Fatal(err)
	}

	// Paused on the agent, which then goes away: nothing can supply its
	// snapshot.
	mctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	_, err = c.Migrate(mctx, id, remote)
	cancel()
	must(t, err)
	must(t, c.Pause(ctx, id))
	must(t, nodeAgent.Close(ctx))
	deadline = time.Now().Add(30 * time.Second)
	for {
		nodes, err := c.Nodes(ctx)
		ready := err == nil
		for _, n := range nodes {
			ready = ready && !(n.ID == remote && n.State == "ready")
		}
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent still counts as ready after it stopped: %+v %v", nodes, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	status, raw := doRequest(t, srv, http.MethodPost, "http://"+srv.Addr().String()+"/sandboxes/"+id+"/connect", `{"timeout": 60}`)
	body := string(raw)
	if status != http.StatusConflict || !strings.Contains(body, id) || !strings.Contains(body, "no store") || !strings.Contains(body, `"code":409`) {
		t.Fatalf("resuming a sandbox whose snapshot went with its node: %d %s; want a 409 saying why", status, body)
	}
	if info, err := c.Get(ctx, id); err != nil || info.State != "paused" {
		t.Fatalf("after the refused resume: %+v %v; want it paused", info, err)
	}
	t.Logf("the counter reached %d across the moves", before)
}
