package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestLocalNodeOverMutualTLS: a server with a local node and a cluster
// listener registers that node at the cluster listener, over TLS; a pure
// API server of the same cluster (another data directory: it takes the
// CA from the state) reaches the node's sandboxes there with its own
// server certificate, and no cluster token crosses that hop.
func TestLocalNodeOverMutualTLS(t *testing.T) {
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	base, binDir := os.Getenv("AENV_BASE_ROOTFS"), os.Getenv("AENV_BIN_DIR")
	if base == "" || binDir == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS and AENV_BIN_DIR must be set (make build base)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n := tagCounter.Add(1)
	srv, err := Start(ctx, Config{Trust: TrustConfig{ClusterListen: "127.0.0.1:0"}, Config: agent.Config{
		Listen: "127.0.0.1:0", NodeID: "tlslocal", DataDir: filepath.Join(dir, "a"), RunDir: filepath.Join(dir, "a-run"),
		RunscPath: runsc, EnvdPath: filepath.Join(binDir, "envd"), BaseRootFS: base,
		SandboxCIDR: fmt.Sprintf("10.23%d.0.0/16", 2+n%7), NetnsTag: "tlsl" + string(rune('a'+n%26)),
		NetnsPoolSize: 1, StoreURL: filepath.Join(dir, "shared-store"), OnStop: cluster.StopKill, Logger: log,
		EtcdClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))},
	}})
	must(t, err)
	defer srv.Close(context.Background())
	e, err := srv.state.Get(ctx, membership.LivePrefix+"tlslocal")
	must(t, err)
	var info membership.NodeInfo
	must(t, json.Unmarshal(e.Value, &info))
	if !info.TLS || info.Address != srv.ClusterAddr().String() {
		t.Fatalf("the local node is registered at %q (TLS %v), want the cluster listener %s over TLS", info.Address, info.TLS, srv.ClusterAddr())
	}
	token, err := os.ReadFile(membership.ClusterTokenPath(srv.cfg.DataDir))
	must(t, err)
	pure, err := Start(ctx, Config{NoLocalNode: true, Config: agent.Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "pure"), RunDir: filepath.Join(dir, "pure-run"),
		EtcdEndpoints: srv.state.Endpoints(), ClusterToken: string(token[:len(token)-1]),
		DataKeyFile: membership.DataKeyPath(srv.cfg.DataDir), StoreURL: srv.cfg.StoreURL,
		OnStop: cluster.StopKill, Logger: log,
	}})
	must(t, err)
	defer pure.Close(context.Background())
	if pure.trust.ca.Hash() != srv.trust.ca.Hash() {
		t.Fatalf("the second server's CA %s is not the first's %s", pure.trust.ca.Hash(), srv.trust.ca.Hash())
	}
	c := client.New("http://"+srv.Addr().String(), srv.APIKey())
	viaPure := client.New("http://"+pure.Addr().String(), srv.APIKey())
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 120})
	deadline := time.Now().Add(10 * time.Second)
	for {
		// The pure server connects to the node when its registry shows it.
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		code, err := viaPure.Run(rctx, sb.SandboxID, "true", client.RunOptions{AccessToken: sb.EnvdAccessToken})
		cancel()
		if err == nil && code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exec through the pure API server: %d %v", code, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := viaPure.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatalf("killing through the pure API server (the node API over mTLS): %v", err)
	}
}
