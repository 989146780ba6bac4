package server

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestBusyboxTemplate runs commands the way the SDKs do (/bin/bash -l -c)
// in a template that has only busybox's sh, with the image's environment
// and working directory applied.
func TestBusyboxTemplate(t *testing.T) {
	srv, c, _ := startServer(t)
	busybox := testutil.RequireBinary(t, "busybox", "")
	store, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(srv.cfg.DataDir, "templates")})
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.NewStage("tiny")
	if err != nil {
		t.Fatal(err)
	}
	root := st.RootFS()
	for _, d := range []string{"bin", "etc", "home/user", "work", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, applet := range []string{"sh", "echo", "pwd", "whoami", "cat", "env"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nuser:x:1000:\n"), 0o644)
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	if err := st.Commit(&template.Template{ID: "tiny", CPUCount: 1, MemoryMB: 256, Image: &template.ImageConfig{
		Env: []string{"PATH=/bin", "FROM_IMAGE=yes"}, WorkingDir: "/work",
	}}); err != nil {
		t.Fatal(err)
	}

	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{TemplateID: "tiny", Timeout: 60, EnvVars: map[string]string{"FROM_REQUEST": "also"}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.SandboxID)
	got := runOut(t, c, sb.SandboxID, `echo "$FROM_IMAGE $FROM_REQUEST $(whoami) $(pwd)"`)
	if got != "yes also user /work" {
		t.Fatalf("got %q, want image env, request env, default user and the image's working dir", got)
	}

	// A template in use cannot be deleted from under its sandbox.
	url := "http://" + srv.Addr().String()
	if status, body := rawRequest(t, srv, "DELETE", url+"/templates/tiny", ""); status != 409 {
		t.Fatalf("deleting a template in use: %d %v, want 409", status, body)
	}
	runOut(t, c, sb.SandboxID, "true")
	if err := c.Kill(ctx, sb.SandboxID); err != nil {
		t.Fatal(err)
	}
	if status, body := rawRequest(t, srv, "DELETE", url+"/templates/tiny", ""); status != 204 {
		t.Fatalf("deleting an unused template: %d %v, want 204", status, body)
	}
}
