package nodeserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

// openHost starts a real node on this host (runsc, network namespaces,
// the base template from AENV_BASE_ROOTFS), as a node agent runs it,
// killing its sandboxes when t ends. It returns the host and its run
// directory.
func openHost(t *testing.T) (*agent.Host, string) {
	t.Helper()
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	base, binDir := os.Getenv("AENV_BASE_ROOTFS"), os.Getenv("AENV_BIN_DIR")
	if base == "" || binDir == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS and AENV_BIN_DIR must be set (make build base)")
	}
	dir := t.TempDir()
	runDir := filepath.Join(dir, "run")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	keys, err := sealed.NewKeyring([]sealed.Key{sealed.NewKey()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h, err := agent.OpenHost(ctx, agent.Config{
		NodeID: "nodetest", DataDir: filepath.Join(dir, "data"), RunDir: runDir,
		RunscPath: runsc, EnvdPath: filepath.Join(binDir, "envd"), BaseRootFS: base,
		SandboxCIDR: "10.245.0.0/16", NetnsTag: "ndtst", NetnsPoolSize: 1,
		// Templates from their directory: no image server to start or
		// leave behind; volumes as plain directories (no loop devices).
		RootFS: agent.RootFSDir, VolumeSize: -1, Logger: log,
	}.WithDefaults(), keys, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(context.Background(), membership.StopKill); err != nil {
			t.Errorf("closing the host: %v", err)
		}
	})
	return h, runDir
}

// options are the suite's options for a real node whose run directory
// is runDir: it does everything.
func options(runDir string) nodetest.Options {
	return nodetest.Options{
		Template: template.BaseID, Snapshots: true, Volumes: true,
		// A crash: the sandbox's process killed under runsc's feet, which
		// the driver notices as it notices an OOM kill.
		Crash: func(t *testing.T, id string) {
			b, err := os.ReadFile(filepath.Join(runDir, "gvisor", "sandboxes", id, "pid"))
			if err != nil {
				t.Fatalf("reading the pid of sandbox %s: %v", id, err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("killing sandbox %s (pid %d): %v", id, pid, err)
			}
		},
		// envd's /envs: the environment its processes start with.
		Getenv: func(t *testing.T, sb *nodev1.Sandbox, name string) string {
			url := "http://" + net.JoinHostPort(sb.Addr, strconv.Itoa(node.EnvdPort)) + "/envs"
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			if sb.EnvdAccessToken != "" {
				req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
			}
			c := &http.Client{Timeout: 10 * time.Second}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("reading the environment of %s: %v", sb.Id, err)
			}
			defer resp.Body.Close()
			var env map[string]string
			if err := json.NewDecoder(resp.Body).Decode(&env); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("reading the environment of %s: %s, %v", sb.Id, resp.Status, err)
			}
			return env[name]
		},
	}
}

// TestConformance runs the node API's suite against a real node: in
// this process (Local), and through the wire in front of it (Remote over
// Handler), as the control plane reaches a node agent.
func TestConformance(t *testing.T) {
	h, runDir := openHost(t)
	opts := options(runDir)
	t.Run("Local", func(t *testing.T) { nodetest.Run(t, h.API(), opts) })
	t.Run("Remote", func(t *testing.T) {
		mux := http.NewServeMux()
		path, handler := nodeapi.Handler(h.API())
		mux.Handle(path, nodeapi.RequireToken("secret", slog.New(slog.DiscardHandler), handler))
		srv := httptest.NewUnstartedServer(mux)
		srv.EnableHTTP2 = true
		srv.Start()
		defer srv.Close()
		rt := nodeapi.Transport("secret")
		defer rt.(interface{ CloseIdleConnections() }).CloseIdleConnections()
		nodetest.Run(t, nodeapi.Dial(h.API().ID(), strings.TrimPrefix(srv.URL, "http://"), rt), opts)
	})
	if left := h.Node().List(); len(left) > 0 {
		t.Errorf("%d sandboxes left after the suite: %v", len(left), fmt.Sprint(left[0].ID))
	}
}
