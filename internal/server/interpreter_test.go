package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestInterpreterAccessToken: the code-interpreter service (port 49999)
// runs code only for the sandbox's own envd access token, through the
// proxy as the SDK calls it. The template is made like the
// code-interpreter one: the node's interpreter binary started once,
// snapshotted while no token existed, and restored into each sandbox,
// which gets its own token through envd's /init only afterwards, so the
// service must follow envd's token rather than anything it remembers. Its
// tree is bash and busybox, with no Jupyter: the executions are bash.
func TestInterpreterAccessToken(t *testing.T) {
	srv, c, url := startServer(t)
	commitInterpreterTemplate(t, srv)
	ctx := context.Background()
	a := mustCreate(t, c, client.CreateOptions{TemplateID: "interp", Timeout: 120})
	b := mustCreate(t, c, client.CreateOptions{TemplateID: "interp", Timeout: 120})
	if a.EnvdAccessToken == "" || a.EnvdAccessToken == b.EnvdAccessToken {
		t.Fatalf("tokens %q and %q: want two different ones", a.EnvdAccessToken, b.EnvdAccessToken)
	}

	execute := func(id, token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", url+"/execute", strings.NewReader(`{"code": "echo ran in $HOSTNAME", "language": "bash"}`))
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49999")
		if token != "" {
			req.Header.Set("X-Access-Token", token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(body)
	}
	refused := func(what string, status int, body string) {
		t.Helper()
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if status != 401 || json.Unmarshal([]byte(body), &e) != nil || e.Code != 401 || e.Message == "" {
			t.Fatalf("%s: %d %s, want 401 with {code, message}", what, status, body)
		}
	}
	ran := func(what string, status int, body string) {
		t.Helper()
		if status != 200 || !strings.Contains(body, `"text":"ran in `) {
			t.Fatalf("%s: %d %s, want the code's output", what, status, body)
		}
	}

	status, body := execute(a.SandboxID, "")
	refused("/execute without a token", status, body)
	status, body = execute(a.SandboxID, b.EnvdAccessToken)
	refused("/execute with another sandbox's token", status, body)
	status, body = execute(a.SandboxID, a.EnvdAccessToken)
	ran("/execute with the sandbox's token", status, body)
	status, body = execute(b.SandboxID, b.EnvdAccessToken)
	ran("/execute in the other sandbox with its token", status, body)

	// Restored once more, by a pause and a resume: still its own token
	// only.
	if err := c.Pause(ctx, a.SandboxID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Connect(ctx, a.SandboxID, time.Minute); err != nil {
		t.Fatal(err)
	}
	status, body = execute(a.SandboxID, b.EnvdAccessToken)
	refused("/execute after a resume with another sandbox's token", status, body)
	status, body = execute(a.SandboxID, a.EnvdAccessToken)
	ran("/execute after a resume with the sandbox's token", status, body)
}

// commitInterpreterTemplate adds the template "interp": the node's
// interpreter as its service, over a tree of the host's bash (with its
// libraries) and busybox.
func commitInterpreterTemplate(t *testing.T, srv *Server) {
	t.Helper()
	busybox := testutil.RequireBinary(t, "busybox", "")
	store, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(srv.cfg.DataDir, "templates")})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.NewStage("interp")
	if err != nil {
		t.Fatal(err)
	}
	root := st.RootFS()
	for _, d := range []string{"bin", "etc", "home/user", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	copyInto(t, root, busybox, "/bin/busybox")
	for _, applet := range []string{"sh", "wget", "cat", "env"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	// bash and the libraries ldd names (absolute paths: "=> /lib/..."
	// and the loader).
	copyInto(t, root, "/bin/bash", "/bin/bash")
	out, err := exec.Command("ldd", "/bin/bash").Output()
	if err != nil {
		t.Fatalf("ldd /bin/bash: %v", err)
	}
	for _, lib := range regexp.MustCompile(`(?m)(/\S+) \(0x`).FindAllStringSubmatch(string(out), -1) {
		copyInto(t, root, lib[1], lib[1])
	}
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644)
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	if err := st.Commit(&template.Template{
		ID: "interp", CPUCount: 1, MemoryMB: 256,
		// No Jupyter in this tree: no Python kernel started ahead.
		StartCmd: "/.aenv/" + template.CodeInterpreterTool + " -prestart=false",
		ReadyCmd: "wget -q -O /dev/null http://127.0.0.1:49999/health",
		Tools:    []string{template.CodeInterpreterTool},
	}); err != nil {
		t.Fatal(err)
	}
}

// copyInto copies the host file src (symlinks followed) to dst under root.
func copyInto(t *testing.T, root, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(root, dst)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestServiceSnapshotLeavesThePoolRefilling: the boot that makes a
// template's ready snapshot (its first create) stops counting as a boot
// in progress once the snapshot is made. It stayed counted, and the warm
// pool refills only while nothing boots: after a node's first start built
// the code interpreter's snapshot, no pool refilled again.
func TestServiceSnapshotLeavesThePoolRefilling(t *testing.T) {
	srv, c, _ := startServerWith(t, func(cfg *Config) { cfg.WarmPoolFloor, cfg.WarmPoolMemory = 1, 1<<30 })
	commitInterpreterTemplate(t, srv)
	ctx := context.Background()
	sb := mustCreate(t, c, client.CreateOptions{TemplateID: "interp", Timeout: 120})
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	waitPooled := func(what string) {
		t.Helper()
		deadline := time.Now().Add(time.Minute)
		for poolOf(srv, "base").Ready < 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %+v after a minute", what, poolOf(srv, "base"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitPooled("the base pool filling to its floor")
	b := mustCreate(t, c, client.CreateOptions{TemplateID: "base", Timeout: 120})
	defer c.Kill(ctx, b.SandboxID)
	if st := poolOf(srv, "base"); st.Served.Warm < 1 {
		t.Fatalf("the create took no prestarted sandbox: %+v", st)
	}
	waitPooled("the base pool refilling after the service's snapshot")
}
