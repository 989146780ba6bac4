package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// TestStateRotateDataKey: `aenv state rotate-data-key` puts a new key
// first in the server's key file (the old one after it) and reseals the
// records in etcd with it; the running server picks the new key up from
// the file, goes on reading its sandboxes and seals new ones with it.
func TestStateRotateDataKey(t *testing.T) {
	e := startServer(t)
	before := e.create(t, "base")
	dataDir, runDir := filepath.Join(shared.dir, "data"), filepath.Join(shared.dir, "run")
	keyFile := membership.DataKeyPath(dataDir)
	old := readKeys(t, keyFile)

	out := e.mustRun(t, "state", "rotate-data-key", "--data-dir", dataDir, "--run-dir", runDir)
	if !strings.Contains(out, "data key rotated") {
		t.Fatalf("rotate printed %q", out)
	}
	keys := readKeys(t, keyFile)
	if len(keys) != len(old)+1 || keys[1].ID != old[0].ID || keys[0].ID == old[0].ID {
		t.Fatalf("key file after the rotation holds %v, before %v: want a new key first, the old ones after", ids(keys), ids(old))
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode: %v %v", fi.Mode(), err)
	}

	ctx := context.Background()
	st, err := state.Open(ctx, state.Config{Endpoints: []string{"unix://" + filepath.Join(runDir, state.SocketName)}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sealedWith := func(id string) string {
		t.Helper()
		ent, err := st.Get(ctx, "sandboxes/"+id)
		if err != nil {
			t.Fatal(err)
		}
		var raw struct {
			Token string `json:"envdAccessToken"`
		}
		json.Unmarshal(ent.Value, &raw)
		return sealed.KeyOf(raw.Token)
	}
	if got := sealedWith(before); got != keys[0].ID {
		t.Fatalf("sandbox %s's token is sealed with %q after the rotation, want %s", before, got, keys[0].ID)
	}
	// The server reads the resealed record (a command needs its token).
	if out := e.mustRun(t, "exec", before, "--", "echo", "still"); strings.TrimSpace(out) != "still" {
		t.Fatalf("exec after the rotation printed %q", out)
	}
	// The resealed records reached the server through its watch (within
	// milliseconds, long before this): it seals with the new key now.
	after := e.create(t, "base")
	if got := sealedWith(after); got != keys[0].ID {
		t.Fatalf("a sandbox created after the rotation is sealed with %q, want the new key %s", got, keys[0].ID)
	}
}

func readKeys(t *testing.T, path string) []sealed.Key {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := sealed.ParseKeys(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func ids(keys []sealed.Key) []string {
	var out []string
	for _, k := range keys {
		out = append(out, k.ID)
	}
	return out
}
