package server

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestBaseSandboxMovesBetweenBases: base's sandboxes run without a
// gofer, from their host's image of base. Two nodes share a store, and
// the agent's base was imaged apart (another superblock, as every host's
// own build has); each puts its image into the store as it starts. A
// base sandbox migrates to the other node: its snapshot names its node's
// image, and the other node restores it from that image, read from the
// store. Paused
// there, it resumes back on the first node (the other draining), on that
// node's own image again. Each time it runs without a gofer, its files
// and processes intact.
func TestBaseSandboxMovesBetweenBases(t *testing.T) {
	other := otherBase(t)
	base := os.Getenv("AENV_BASE_ROOTFS")
	srv, c, _ := startAgent(t, "bimg", agentSetup{localNode: true, rootImages: true, agentBase: other})
	ctx := context.Background()
	images := map[string]string{}
	for node, root := range map[string]string{"bimga": base, "bimgb": other} {
		id, err := template.BaseImageID(template.BaseImageFile(root))
		if err != nil {
			t.Fatalf("node %s made no image of its base: %v", node, err)
		}
		images[node] = id
	}
	if images["bimga"] == images["bimgb"] {
		t.Fatalf("both nodes' base images are %s: the test needs two", images["bimga"])
	}
	// Each node publishes its base's image as it starts, ahead of any
	// snapshot.
	storeDir := filepath.Join(filepath.Dir(srv.cfg.DataDir), "shared-store")
	published := func(node string) error {
		_, err := os.Stat(filepath.Join(storeDir, "snapshots", images[node], "manifest.json"))
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for node := range images {
		for published(node) != nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if err := published(node); err != nil {
			t.Fatalf("node %s did not publish its base's image %s: %v", node, images[node], err)
		}
	}
	// startAgent puts both nodes' directories side by side.
	runDirs := map[string]string{"bimga": srv.cfg.RunDir, "bimgb": filepath.Join(filepath.Dir(srv.cfg.DataDir), "bimgb-run")}
	id := mustCreate(t, c, client.CreateOptions{Timeout: 300}).SandboxID
	runWithin(t, c, id, "echo kept > /home/user/state.txt && "+busyboxCounter, 20*time.Second)
	info, err := c.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	from := info.NodeID
	to := map[string]string{"bimga": "bimgb", "bimgb": "bimga"}[from]
	withoutGofer := func(node, when string) {
		t.Helper()
		if n := testutil.Gofers(t, runDirs[node]); n != 0 {
			t.Fatalf("%s node %s runs %d gofers, want none", when, node, n)
		}
	}
	withoutGofer(from, "at first")
	moved := movedSandbox{t: t, c: c, id: id, check: "cat /home/user/state.txt", want: "kept"}
	before := moved.count("before the migration")

	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	m, err := c.Migrate(mctx, id, to)
	cancel()
	if err != nil {
		t.Fatalf("migrating to the node with another base: %v", err)
	}
	if m.NodeID != to {
		t.Fatalf("migration: %+v", m)
	}
	before = moved.carriesOn("after the migration", before)
	withoutGofer(to, "after the migration")

	must(t, c.Pause(ctx, id))
	if _, err := c.Drain(ctx, to, true); err != nil {
		t.Fatal(err)
	}
	got, resumed, err := c.Connect(ctx, id, 5*time.Minute)
	if err != nil || !resumed || got.NodeID != from {
		t.Fatalf("resuming on the first node: %+v resumed=%v %v", got, resumed, err)
	}
	moved.carriesOn("after the resume on the first node", before)
	withoutGofer(from, "after the resume")
}

// TestBaseSandboxStaysWithoutStore: two nodes share no store, and their
// bases were imaged apart. A base sandbox cannot move to the other node,
// which has no way to read its image: the migration is refused with a
// 409 that says what to do, and the sandbox runs on where it was.
func TestBaseSandboxStaysWithoutStore(t *testing.T) {
	other := otherBase(t)
	_, c, _ := startAgent(t, "bnst", agentSetup{localNode: true, noStore: true, rootImages: true, agentBase: other})
	ctx := context.Background()
	id := mustCreate(t, c, client.CreateOptions{Timeout: 300}).SandboxID
	runWithin(t, c, id, "echo kept > /home/user/state.txt", 20*time.Second)
	info, err := c.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	to := map[string]string{"bnsta": "bnstb", "bnstb": "bnsta"}[info.NodeID]
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err = c.Migrate(mctx, id, to)
	cancel()
	if !isStatus(err, 409) || !strings.Contains(err.Error(), "--store") {
		t.Fatalf("migrating to a node with another base and no store: %v, want a 409 that names --store", err)
	}
	t.Logf("refused: %v", err)
	if got, err := c.Get(ctx, id); err != nil || got.State != "running" || got.NodeID != info.NodeID {
		t.Fatalf("after the refused migration: %+v %v, want it running on %s", got, err, info.NodeID)
	}
	if got := runWithin(t, c, id, "cat /home/user/state.txt", 20*time.Second); got != "kept" {
		t.Fatalf("its file after the refused migration: %q", got)
	}
}

// otherBase is another host's base: the same files as AENV_BASE_ROOTFS
// (hard links where it can), which its server images apart as it starts.
func otherBase(t *testing.T) string {
	t.Helper()
	base := os.Getenv("AENV_BASE_ROOTFS")
	if base == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS not set (make base builds it)")
	}
	other := filepath.Join(t.TempDir(), "other-base")
	if err := exec.Command("cp", "-al", base, other).Run(); err != nil {
		// Another filesystem (a tmpfs /tmp): a copy, ~200 MB.
		t.Logf("hard-linking base: %v (another filesystem?); copying it", err)
		if err := os.RemoveAll(other); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", base, other).CombinedOutput(); err != nil {
			t.Fatalf("copying base: %v: %s", err, out)
		}
	}
	return other
}

// TestFilesOnlyPauseWithoutGofer: a base sandbox without a gofer, paused
// with its files only, resumes by booting afresh with them, deletions
// too. Its root's upper layer holds the mount point of /.aenv, the
// node's read-only tools, which the files put back must leave alone.
func TestFilesOnlyPauseWithoutGofer(t *testing.T) {
	srv, c, url := startServerWith(t, func(cfg *Config) { cfg.RootImages, cfg.BaseRootImage = true, true })
	id := mustCreate(t, c, client.CreateOptions{Timeout: 120}).SandboxID
	if n := testutil.Gofers(t, srv.cfg.RunDir); n != 0 {
		t.Fatalf("a base sandbox runs with %d gofers, want none", n)
	}
	runOut(t, c, id, "echo kept > /home/user/kept && rm /home/user/.bash_logout")
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/pause", `{"memory":false}`); status != 204 {
		t.Fatalf("pause with files only: %d %v", status, body)
	}
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/connect", `{"timeout":60}`); status != 201 {
		t.Fatalf("resume from files: %d %v", status, body)
	}
	if got := runOut(t, c, id, "cat /home/user/kept; test -e /home/user/.bash_logout && echo deletion-lost; /.aenv/envd --version >/dev/null && echo envd-ok"); got != "kept\nenvd-ok" {
		t.Fatalf("after the resume: %q", got)
	}
	if n := testutil.Gofers(t, srv.cfg.RunDir); n != 0 {
		t.Fatalf("the resumed sandbox runs with %d gofers, want none", n)
	}
}
