package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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
// token. The token joins no second server.
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
	// The token joined one server: another gets nothing with it.
	cfgC := cfgB(sjc.URL, sjc.Token, sjc.CAHash)
	cfgC.DataDir, cfgC.RunDir = filepath.Join(dir, "c"), filepath.Join(dir, "c-run")
	if _, err := Start(ctx, cfgC); err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "used join token") {
		t.Fatalf("a second server joining with a used token: %v, want a 401 saying it was used", err)
	}
	if _, err := os.Stat(membership.CAFiles(cfgC.DataDir).CAKeyPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused server holds the CA's key (%v)", err)
	}
	if b, err = Start(ctx, cfgB(sjc.URL, "", sjc.CAHash)); err != nil {
		t.Fatalf("the joined server starting again without a token: %v", err)
	}
	if _, err := client.New("http://"+b.Addr().String(), a.APIKey()).Nodes(ctx); err != nil {
		t.Fatalf("the restarted joined server: %v", err)
	}
}

// TestServersRunEtcdMembers: three API servers hold the cluster's state
// themselves, each a member of one embedded etcd over TLS with the
// cluster's CA (no external etcd). The second and third join with
// `join-command --server`'s token and a member of their own; with the
// first server stopped, a key made on the second works on the third, and
// the first, started again, has it too. A member name the cluster has is
// a 409; a joined member restarted without its peer listener is refused
// with what to do.
func TestServersRunEtcdMembers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	url := func() string { return fmt.Sprintf("https://127.0.0.1:%d", freePort(t)) }
	cfgA := pureTLSEtcdConfig(dir, "a", "a-run", url(), log)
	cfgA.EtcdPeerURLs = []string{url()}
	a, err := Start(ctx, cfgA)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if a != nil {
			a.Close(context.Background())
		}
	}()
	admin := a.APIKey()
	on := func(s *Server) *client.Client { return client.New("http://"+s.Addr().String(), admin) }
	// A server's token joins one server: each joiner has its own.
	joiner := func(name string) Config {
		sjc, err := on(a).CreateServerJoinToken(ctx, time.Hour, "member "+name)
		if err != nil {
			t.Fatal(err)
		}
		return Config{NoLocalNode: true, JoinToken: sjc.Token, Trust: TrustConfig{ClusterListen: "127.0.0.1:0"}, Config: agent.Config{
			Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, name), RunDir: filepath.Join(dir, name+"-run"),
			Join: sjc.URL, CAHash: sjc.CAHash, StoreURL: filepath.Join(dir, "store"), OnStop: cluster.StopKill, Logger: log,
			EtcdClientURLs: []string{url()}, EtcdPeerURLs: []string{url()}, EtcdName: name,
		}}
	}
	cfgB, cfgC := joiner("b"), joiner("c")
	b, err := Start(ctx, cfgB)
	if err != nil {
		t.Fatalf("joining with a member of the cluster's etcd: %v", err)
	}
	defer func() {
		if b != nil {
			b.Close(context.Background())
		}
	}()
	c, err := Start(ctx, cfgC)
	if err != nil {
		t.Fatalf("joining the third member: %v", err)
	}
	defer func() {
		if c != nil {
			c.Close(context.Background())
		}
	}()
	ms, err := c.state.Members(ctx)
	if err != nil || len(ms) != 3 {
		t.Fatalf("etcd members: %+v %v", ms, err)
	}
	for _, m := range ms {
		if m.Learner || !m.Started {
			t.Fatalf("member %+v is not a started voter", m)
		}
	}
	if eps := c.state.Endpoints(); len(eps) != 3 || eps[0] != cfgC.EtcdClientURLs[0] {
		t.Fatalf("c reaches etcd at %v: want its own member first, then the others", eps)
	}

	// A name the cluster has: 409, and nothing of the cluster's written.
	dup := joiner("b")
	dup.DataDir, dup.RunDir = filepath.Join(dir, "dup"), filepath.Join(dir, "dup-run")
	if _, err := Start(ctx, dup); err == nil || !strings.Contains(err.Error(), "409") || !strings.Contains(err.Error(), "another name") {
		t.Fatalf("joining under a member name the cluster has: %v, want a 409", err)
	}
	// The join did not happen: its token is still the operator's.
	toks, err := on(a).JoinTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(toks, func(tk client.JoinToken) bool {
		return tk.Description == "member b" && tk.ID == strings.Split(dup.JoinToken, ".")[0]
	}) {
		t.Fatalf("the refused join's token is gone: %+v", toks)
	}

	// The first server stops: two of three members hold the state.
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	a = nil
	k, err := on(b).CreateKey(ctx, "while a is down", client.KeyOptions{})
	if err != nil {
		t.Fatalf("making a key with the first server down: %v", err)
	}
	// Servers learn keys through a watch: give it a moment.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		err := client.New("http://"+c.Addr().String(), k.Key).CheckKey(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the key made on b, on c, 10 s on: %v", err)
		}
	}
	if a, err = Start(ctx, cfgA); err != nil {
		t.Fatalf("the first server starting again: %v", err)
	}
	if err := client.New("http://"+a.Addr().String(), k.Key).CheckKey(ctx); err != nil {
		t.Fatalf("the key made while it was down, on the first server: %v", err)
	}

	// A joined member restarts from its data, with no token; without its
	// peer listener it is refused, naming the flags.
	if err := b.Close(ctx); err != nil {
		t.Fatal(err)
	}
	noPeers := cfgB
	noPeers.EtcdClientURLs, noPeers.EtcdPeerURLs = nil, nil
	if _, err := Start(ctx, noPeers); err == nil || !strings.Contains(err.Error(), "--etcd-peer-listen") {
		t.Fatalf("a member's server restarted without its peer listener: %v", err)
	}
	cfgB.JoinToken = ""
	if b, err = Start(ctx, cfgB); err != nil {
		t.Fatalf("the second server starting again: %v", err)
	}
	listed, err := on(b).EtcdMembers(ctx)
	leaders := 0
	for _, m := range listed {
		if m.Leader {
			leaders++
		}
	}
	if err != nil || len(listed) != 3 || leaders != 1 {
		t.Fatalf("GET /cluster/etcd: %+v %v, want 3 members, one the leader", listed, err)
	}
	if servers, err := on(c).Servers(ctx); err != nil || len(servers) != 3 {
		t.Fatalf("GET /cluster/servers: %+v %v, want the 3 servers", servers, err)
	}

	// c goes for good: removed, it no longer counts against the quorum.
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	c = nil
	if err := on(a).RemoveEtcdMember(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	if err := on(a).RemoveEtcdMember(ctx, "c"); !isStatus(err, 404) {
		t.Fatalf("removing a member removed: %v, want 404", err)
	}
	if listed, err := on(a).EtcdMembers(ctx); err != nil || len(listed) != 2 {
		t.Fatalf("members after removing c: %+v %v", listed, err)
	}
	if _, err := on(a).CreateKey(ctx, "on two members", client.KeyOptions{}); err != nil {
		t.Fatal(err)
	}
}
