package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// TestSecretsSealedAtRest: after a pause that keeps only the files (its
// resume boots afresh with the create's environment, from the snapshot's
// metadata), neither the environment variable's value nor the sandbox's
// envd token is anywhere in clear: not in the store's files, the data
// directory (the snapshot catalog, etcd's own files) nor an etcd backup.
// The resume still gives the process its environment.
func TestSecretsSealedAtRest(t *testing.T) {
	storeDir := filepath.Join(t.TempDir(), "store")
	srv, c, url := startServerWith(t, func(cfg *Config) { cfg.StoreURL = storeDir })
	ctx := context.Background()
	b := make([]byte, 16)
	rand.Read(b)
	secret := "s3cr3t-" + hex.EncodeToString(b)
	sb := mustCreate(t, c, client.CreateOptions{Timeout: 120, EnvVars: map[string]string{"SECRET": secret}})
	if got := runOut(t, c, sb.SandboxID, `echo "$SECRET"`); got != secret {
		t.Fatalf("SECRET in the sandbox: %q", got)
	}
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+sb.SandboxID+"/pause", `{"memory": false}`); status != 204 {
		t.Fatalf("pause: %d %v", status, body)
	}

	backup := filepath.Join(t.TempDir(), "state.db")
	f, err := os.Create(backup)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.state.Backup(ctx, f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	needles := map[string][]byte{"the env var": []byte(secret), "the envd token": []byte(sb.EnvdAccessToken)}
	metas := 0
	for _, root := range []string{storeDir, srv.cfg.DataDir, backup} {
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			for what, needle := range needles {
				if bytes.Contains(data, needle) {
					t.Errorf("%s holds %s in clear", p, what)
				}
			}
			if bytes.Contains(data, []byte(`"sealedEnvVars"`)) {
				metas++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if metas == 0 {
		t.Fatal("no snapshot metadata with sealed environment variables found: the search looked in the wrong places")
	}

	if _, _, err := c.Connect(ctx, sb.SandboxID, time.Minute); err != nil {
		t.Fatal(err)
	}
	if got := runOut(t, c, sb.SandboxID, `echo "$SECRET"`); got != secret {
		t.Fatalf("SECRET after the resume: %q, want %q", got, secret)
	}
}
