package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/testutil"
)

// startWithAgent starts a server and a node agent that joins it, on this
// host, sharing a store; with localNode the server runs its own node too
// (node "<name>a"; the agent's is "<name>b"). Both are closed when tb
// ends.
func startWithAgent(tb testing.TB, name string, localNode bool) (*Server, *client.Client) {
	tb.Helper()
	srv, c, _ := startAgent(tb, name, agentSetup{localNode: localNode})
	return srv, c
}

// agentSetup tunes startAgent.
type agentSetup struct {
	// localNode has the server run its own node too.
	localNode bool
	// noStore leaves the nodes without a store they share.
	noStore bool
	// wrapNode wraps the server's calls to the agent (Config.wrapNode).
	wrapNode func(nodeapi.Node) nodeapi.Node
	// rootImages runs both nodes' sandboxes without a gofer, base's too
	// (agent.Config.RootImages, BaseRootImage).
	rootImages bool
	// agentBase, when set, is the agent's base tree.
	agentBase string
}

// startAgent is startWithAgent as setup says, returning the agent too.
func startAgent(tb testing.TB, name string, setup agentSetup) (*Server, *client.Client, *agent.Agent) {
	tb.Helper()
	localNode := setup.localNode
	testutil.RequireRoot(tb)
	runsc := testutil.RequireBinary(tb, "runsc", "AENV_RUNSC")
	base, binDir := os.Getenv("AENV_BASE_ROOTFS"), os.Getenv("AENV_BIN_DIR")
	if base == "" || binDir == "" {
		testutil.Unavailable(tb, "AENV_BASE_ROOTFS and AENV_BIN_DIR must be set (make build base)")
	}
	ctx := context.Background()
	dir := tb.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	store := filepath.Join(dir, "shared-store")
	if setup.noStore {
		store = ""
	}
	nodeCfg := func(id string) agent.Config {
		n := tagCounter.Add(1)
		return agent.Config{
			Listen: "127.0.0.1:0", NodeID: id, DataDir: filepath.Join(dir, id), RunDir: filepath.Join(dir, id+"-run"),
			RunscPath: runsc, EnvdPath: filepath.Join(binDir, "envd"), BaseRootFS: base,
			SandboxCIDR: fmt.Sprintf("10.23%d.0.0/16", 2+n%7), NetnsTag: name + string(rune('a'+n%26)),
			NetnsPoolSize: 1, StoreURL: store, OnStop: cluster.StopKill, Logger: log,
			RootImages: setup.rootImages, BaseRootImage: setup.rootImages,
		}
	}
	cfg := Config{Config: nodeCfg(name + "a"), NoLocalNode: !localNode, wrapNode: setup.wrapNode}
	cfg.EtcdClientURLs = []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(tb))}
	srv, err := Start(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { srv.Close(context.Background()) })
	url := "http://" + srv.Addr().String()
	token, err := os.ReadFile(membership.ClusterTokenPath(cfg.DataDir))
	if err != nil {
		tb.Fatal(err)
	}
	agentCfg := nodeCfg(name + "b")
	agentCfg.Join, agentCfg.ClusterToken = url, strings.TrimSpace(string(token))
	if setup.agentBase != "" {
		agentCfg.BaseRootFS = setup.agentBase
	}
	nodeAgent, err := agent.Start(ctx, agentCfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nodeAgent.Close(context.Background()) })
	c := client.New(url, srv.APIKey())
	want := 1
	if localNode {
		want = 2
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		nodes, err := c.Nodes(ctx)
		ready := 0
		for _, n := range nodes {
			if n.State == "ready" {
				ready++
			}
		}
		if err == nil && ready == want {
			return srv, c, nodeAgent
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d nodes are not ready: %+v %v", want, nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runWithin runs cmd in sandbox id and returns its output, failing tb if
// it does not succeed within limit.
func runWithin(tb testing.TB, c *client.Client, id, cmd string, limit time.Duration) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var out, errOut bytes.Buffer
	code, err := c.Run(ctx, id, cmd, client.RunOptions{Stdout: &out, Stderr: &errOut})
	if err != nil || code != 0 {
		tb.Fatalf("running %q in %s: code %d, %v, stderr %q", cmd, id, code, err, errOut.String())
	}
	return strings.TrimSpace(out.String())
}

// TestAgentResumeAnswers: a sandbox on a node agent, paused and at once
// resumed there (on another network slot), answers through the API
// straight away: the agent's proxy dropped its connections to the stopped
// sandbox, which pooled would have hung on the old address.
func TestAgentResumeAnswers(t *testing.T) {
	_, c := startWithAgent(t, "agrt", false)
	ctx := context.Background()
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 120})
	if got := runWithin(t, c, sb.SandboxID, "echo before", 20*time.Second); got != "before" {
		t.Fatalf("before the pause: %q", got)
	}
	if err := c.Pause(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	if _, resumed, err := c.Connect(ctx, sb.SandboxID, time.Minute); err != nil || !resumed {
		t.Fatalf("resuming: resumed=%v %v", resumed, err)
	}
	if got := runWithin(t, c, sb.SandboxID, "echo after", 20*time.Second); got != "after" {
		t.Fatalf("after the resume: %q", got)
	}
}
