package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/membership"
)

// TestEveryServerReachesEverySandbox: in a cluster of a server with a
// local node, a node agent and a pure API server, every sandbox answers
// commands, file transfers and a program on a port of its user's through
// every server. The local node is registered at the server's address (it
// listens on one), and the other servers reach it there with the cluster
// token: before it was, a
// sandbox on a server's own node answered through that server only.
func TestEveryServerReachesEverySandbox(t *testing.T) {
	srv, c := startWithAgent(t, "mixed", true)
	ctx := context.Background()
	token, err := os.ReadFile(membership.ClusterTokenPath(srv.cfg.DataDir))
	must(t, err)
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	pure, err := Start(ctx, Config{NoLocalNode: true, Config: agent.Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "pure"), RunDir: filepath.Join(dir, "pure-run"),
		EtcdEndpoints: srv.state.Endpoints(), ClusterToken: strings.TrimSpace(string(token)),
		DataKeyFile: membership.DataKeyPath(srv.cfg.DataDir), StoreURL: srv.cfg.StoreURL,
		OnStop: cluster.StopKill, Logger: log,
	}})
	must(t, err)
	defer pure.Close(context.Background())
	viaPure := client.New("http://"+pure.Addr().String(), srv.APIKey())

	nodes, err := c.Nodes(ctx)
	must(t, err)
	for _, n := range nodes {
		if n.Address == "" {
			t.Fatalf("node %s is registered without an address: %+v", n.ID, nodes)
		}
	}
	if local := srv.cfg.NodeID; !hasNode(nodes, local, srv.Addr().String()) {
		t.Fatalf("the server's local node %s is not registered at the server's address %s: %+v", local, srv.Addr(), nodes)
	}

	// Sandboxes until both nodes run some.
	onNode, tokens := map[string]string{}, map[string]string{}
	for i := 0; i < 8 && len(onNode) < 2; i++ {
		sb, err := c.Create(ctx, client.CreateOptions{TemplateID: "base", Timeout: 300})
		must(t, err)
		defer c.Kill(context.Background(), sb.SandboxID)
		got, err := c.Get(ctx, sb.SandboxID)
		must(t, err)
		onNode[got.NodeID], tokens[sb.SandboxID] = sb.SandboxID, sb.EnvdAccessToken
	}
	if len(onNode) < 2 {
		t.Fatalf("eight sandboxes all went to one node: %v", onNode)
	}
	// A program of the user's on a port of each sandbox.
	for _, id := range onNode {
		runOut(t, c, id, "mkdir -p /tmp/www && echo port of "+id+" > /tmp/www/who.txt && cd /tmp/www && setsid python3 -m http.server 8080 >/dev/null 2>&1 < /dev/null &")
	}
	for nodeID, id := range onNode {
		for name, via := range map[string]*client.Client{"the server with the node": c, "the pure API server": viaPure} {
			addr := srv.Addr().String()
			if via == viaPure {
				addr = pure.Addr().String()
			}
			if got := userPortGet(t, addr, id, 8080, "/who.txt"); got != "port of "+id+"\n" {
				t.Fatalf("port 8080 of sandbox %s on node %s through %s: %q", id, nodeID, name, got)
			}
			var out bytes.Buffer
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			code, err := via.Run(rctx, id, "echo reached", client.RunOptions{Stdout: &out, AccessToken: tokens[id]})
			cancel()
			if err != nil || code != 0 || strings.TrimSpace(out.String()) != "reached" {
				t.Fatalf("sandbox %s on node %s through %s: code %d, %v, output %q", id, nodeID, name, code, err, out.String())
			}
			want := "file of " + id + " through " + name
			fopts := client.FileOptions{AccessToken: tokens[id]}
			if err := via.Upload(ctx, id, "/tmp/reach.txt", strings.NewReader(want), fopts); err != nil {
				t.Fatalf("uploading to sandbox %s on node %s through %s: %v", id, nodeID, name, err)
			}
			rc, _, err := via.Download(ctx, id, "/tmp/reach.txt", fopts)
			if err != nil {
				t.Fatalf("downloading from sandbox %s on node %s through %s: %v", id, nodeID, name, err)
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			must(t, err)
			if string(b) != want {
				t.Fatalf("sandbox %s on node %s through %s: downloaded %q, want %q", id, nodeID, name, b, want)
			}
		}
	}

	// The node API too: the pure server pauses and kills sandboxes on
	// both nodes.
	for nodeID, id := range onNode {
		if err := viaPure.Pause(ctx, id); err != nil {
			t.Fatalf("pausing sandbox %s on node %s through the pure API server: %v", id, nodeID, err)
		}
		if err := viaPure.Kill(ctx, id); err != nil {
			t.Fatalf("killing sandbox %s on node %s through the pure API server: %v", id, nodeID, err)
		}
		if _, err := viaPure.Get(ctx, id); !isStatus(err, 404) {
			t.Fatalf("sandbox %s on node %s is still there after a kill through the pure API server: %v", id, nodeID, err)
		}
		// The other server learns of the kill from the store's watch,
		// a moment later on a loaded host.
		waitGone(t, c, id, 5*time.Second)
	}
}

func hasNode(nodes []client.Node, id, address string) bool {
	for _, n := range nodes {
		if n.ID == id && n.Address == address {
			return true
		}
	}
	return false
}

// userPortGet GETs path from port of sandbox id through the API server at
// addr (its sandbox host name, as getHost(port) gives), retrying while the
// program starts.
func userPortGet(t *testing.T, addr, id string, port int, path string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		must(t, err)
		_, hostPort, _ := net.SplitHostPort(addr)
		req.Host = fmt.Sprintf("%d-%s.localhost:%s", port, id, hostPort)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return string(b)
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, b)
		} else {
			last = err.Error()
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatalf("GET %s from port %d of sandbox %s through %s: %s", path, port, id, addr, last)
	return ""
}
