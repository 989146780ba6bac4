package server

import (
	"context"
	"errors"
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
	"github.com/aenvhq/aenv/internal/pki"
)

// TestServerJoin: a second API server joins with `join-command
// --server`'s token and the CA hash, kubeadm's way. A wrong CA hash
// fails before the token is sent; a node's token is refused (it never
// yields the CA's key), and a server's token joins no node. The joined
// server holds the cluster's CA, data key and cluster token, reaches the
// cluster's etcd over TLS as a server (the keys of the first server work
// on it), issues join tokens of the same CA, and starts again without a
// token.
func TestServerJoin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	etcdURL := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	cfgA := pureTLSEtcdConfig(dir, "a", "a-run", etcdURL, log)
	a, err := Start(ctx, cfgA)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	ca := client.New("http://"+a.Addr().String(), a.APIKey())

	bDir := filepath.Join(dir, "b")
	cfgB := func(url, token, hash string) Config {
		return Config{NoLocalNode: true, JoinToken: token, Trust: TrustConfig{ClusterListen: "127.0.0.1:0"}, Config: agent.Config{
			Listen: "127.0.0.1:0", DataDir: bDir, RunDir: filepath.Join(dir, "b-run"), Join: url, CAHash: hash,
			StoreURL: filepath.Join(dir, "store"), OnStop: cluster.StopKill, Logger: log,
		}}
	}
	noSecrets := func(what string) {
		t.Helper()
		for _, f := range []string{"ca.key", "ca.crt", "data-key", "cluster-token"} {
			if _, err := os.Stat(filepath.Join(membership.SecretsDir(bDir), f)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("%s: %s left in the data directory (%v)", what, f, err)
			}
		}
	}

	sjc, err := ca.CreateServerJoinToken(ctx, time.Hour, "second server")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("aenv server --join %s --token %s --ca-hash %s", sjc.URL, sjc.Token, sjc.CAHash)
	if sjc.Role != "server" || sjc.Command != want {
		t.Fatalf("server join command: %q (role %q), want %q", sjc.Command, sjc.Role, want)
	}

	// Another CA's hash: refused in the handshake, before the token goes.
	other, err := pki.NewCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	joins := a.trust.joins.Load()
	if _, err := Start(ctx, cfgB(sjc.URL, sjc.Token, other.Hash())); err == nil || !errors.Is(err, pki.ErrUntrusted) {
		t.Fatalf("joining with another CA's hash: %v, want ErrUntrusted", err)
	}
	if n := a.trust.joins.Load(); n != joins {
		t.Fatalf("a join that failed its CA check reached the server (%d joins, was %d)", n, joins)
	}
	noSecrets("a join with the wrong CA hash")

	// A node's token: no server joins with it.
	njc, err := ca.CreateJoinToken(ctx, time.Hour, "a node")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(ctx, cfgB(njc.URL, njc.Token, njc.CAHash)); err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "joins a node") {
		t.Fatalf("a server joining with a node's token: %v, want 403 saying it joins a node", err)
	}
	noSecrets("a join with a node's token")
	// A server's token: no node joins with it.
	if code, _, body, _ := tlsJoinAs(t, sjc.URL, sjc.Token, "n1", "i1@host1"); code != 403 || !strings.Contains(body, "API server") {
		t.Fatalf("a node joining with a server's token: %d %s, want 403", code, body)
	}

	b, err := Start(ctx, cfgB(sjc.URL, sjc.Token, sjc.CAHash))
	if err != nil {
		t.Fatalf("joining as a server: %v", err)
	}
	defer func() {
		if b != nil {
			b.Close(context.Background())
		}
	}()
	if got := b.trust.ca.Hash(); got != a.trust.ca.Hash() {
		t.Fatalf("the joined server's CA is %s, the cluster's %s", got, a.trust.ca.Hash())
	}
	if b.etcdTLS == nil {
		t.Fatal("the joined server does not reach the cluster's etcd over TLS with the CA's certificates")
	}
	for _, f := range []string{membership.DataKeyPath(bDir), membership.ClusterTokenPath(bDir), membership.CAFiles(bDir).CAKeyPath()} {
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		wantB, _ := os.ReadFile(strings.Replace(f, bDir, cfgA.DataDir, 1))
		if strings.TrimSpace(string(got)) != strings.TrimSpace(string(wantB)) {
			t.Fatalf("%s differs from the first server's", f)
		}
		if st, _ := os.Stat(f); st.Mode().Perm() != 0o600 {
			t.Fatalf("%s has mode %v", f, st.Mode().Perm())
		}
	}
	// The first server's key works on the joined one: one cluster.
	cb := client.New("http://"+b.Addr().String(), a.APIKey())
	if _, err := cb.Nodes(ctx); err != nil {
		t.Fatalf("the first server's key on the joined server: %v", err)
	}
	jcB, err := cb.CreateJoinToken(ctx, time.Hour, "from b")
	if err != nil {
		t.Fatal(err)
	}
	if jcB.CAHash != sjc.CAHash {
		t.Fatalf("the joined server's join command pins %s, the cluster's CA is %s", jcB.CAHash, sjc.CAHash)
	}

	// A restart needs no token: it joined before.
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ca.RevokeJoinToken(ctx, sjc.ID); err != nil {
		t.Fatal(err)
	}
	if b, err = Start(ctx, cfgB(sjc.URL, "", sjc.CAHash)); err != nil {
		t.Fatalf("the joined server starting again without a token: %v", err)
	}
	if _, err := client.New("http://"+b.Addr().String(), a.APIKey()).Nodes(ctx); err != nil {
		t.Fatalf("the restarted joined server: %v", err)
	}
}
