package membership

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// permits reports whether perms let a user read (or, with write, write)
// key, as etcd's RBAC decides: a key alone, or a prefix's range.
func permits(perms []state.Permission, key string, write bool) bool {
	for _, p := range perms {
		if write && !p.Write {
			continue
		}
		if key == p.Key || (p.Prefix && strings.HasPrefix(key, p.Key)) {
			return true
		}
	}
	return false
}

// TestNodePermissions: a node writes its own registration, known record
// and drain mark and nothing else, reads where the cluster's members are,
// and reads no secret of the cluster.
func TestNodePermissions(t *testing.T) {
	perms := NodePermissions("n1")
	for _, c := range []struct {
		key         string
		read, write bool
	}{
		{LivePrefix + "n1", true, true},
		{KnownPrefix + "n1", true, true},
		{DrainPrefix + "n1", true, true},
		{state.HealthKey, true, false},
		{DataKeyCheckKey, true, false},
		// The other members' records: read (the node keeps its
		// sandboxes off their addresses), never written.
		{LivePrefix + "n10", true, false},
		{KnownPrefix + "n10", true, false},
		{DrainPrefix + "n10", false, false},
		{LivePrefix + "n2", true, false},
		{KnownPrefix + "n2", true, false},
		{DrainPrefix + "n2", false, false},
		{ServerPrefix + "s1", true, false},
		{RemovedPrefix + "n2", true, false},
		{"apikeys/k1", false, false},
		{CAKey, false, false},
		{tokenKey, false, false},
		{JoinTokenPrefix + "x", false, false},
		{RemovedPrefix + "n1", true, false},
		{"sandboxes/s1", false, false},
		{"elections/deadlines/1", false, false},
	} {
		if got := permits(perms, c.key, false); got != c.read {
			t.Errorf("node n1 reads %s: %v, want %v", c.key, got, c.read)
		}
		if got := permits(perms, c.key, true); got != c.write {
			t.Errorf("node n1 writes %s: %v, want %v", c.key, got, c.write)
		}
	}
	for _, p := range perms {
		if p.Write && p.Prefix {
			t.Errorf("a write permission on a prefix (%s) reaches other nodes' keys", p.Key)
		}
	}
	if NodeUser("n1") != "node:n1" || EtcdServerUser != (pki.Identity{Role: pki.RoleServer, Name: EtcdClientName}).CommonName() {
		t.Fatalf("users %q, %q: not the certificates' CommonNames", NodeUser("n1"), EtcdServerUser)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// nodeKeypair is a node certificate of ca for id.
func nodeKeypair(t *testing.T, ca *pki.CA, id string) *pki.Keypair {
	t.Helper()
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.Issue(&key.PublicKey, pki.Request{Identity: pki.Identity{Role: pki.RoleNode, Name: id, Nodes: []string{id}}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	kp, err := pki.NewKeypair(certPEM, key, ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// TestEtcdOverTLSWithRBAC runs the embedded member over https with
// client-certificate auth and RBAC, as `aenv server --etcd-listen
// https://...` does: a client without a certificate, or with one of
// another CA (even naming the same user), gets nothing; a node's
// certificate does what a node agent does for its own id, and cannot
// write another node's registration, nor read or write API keys; a
// server's does everything; a removed node's certificate reaches
// nothing any more.
func TestEtcdOverTLSWithRBAC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	secrets := t.TempDir()
	ca, err := BootstrapCA(pki.Files{Dir: secrets, Name: "server"}, true, log)
	if err != nil {
		t.Fatal(err)
	}
	mf := EtcdMemberFiles(secrets)
	etls, err := OpenEtcdTLS(EtcdTLSConfig{CA: ca, Member: &mf, MemberName: "aenv", Client: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer etls.Close()
	url := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	srv, err := state.Open(ctx, state.Config{DataDir: filepath.Join(t.TempDir(), "etcd"), ClientURLs: []string{url},
		MemberTLS: etls.MemberTLS(), ClientTLS: etls.ClientTLS(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if err := srv.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := srv.EnableAuth(ctx, EtcdServerUser); err != nil {
		t.Fatal(err)
	}
	if err := srv.EnableAuth(ctx, EtcdServerUser); err != nil {
		t.Fatalf("enabling auth again: %v", err)
	}
	if on, err := srv.AuthEnabled(ctx); err != nil || !on {
		t.Fatalf("auth enabled: %v, %v", on, err)
	}
	keys, err := sealed.NewKeyring([]sealed.Key{sealed.NewKey()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDataKey(ctx, srv, keys, true); err != nil {
		t.Fatal(err)
	}
	// The server's certificate does anything.
	if _, err := srv.Put(ctx, "apikeys/k1", []byte("secret"), state.WriteOptions{}); err != nil {
		t.Fatalf("server writing an API key: %v", err)
	}
	if _, err := srv.Put(ctx, KnownPrefix+"n2", []byte(`{"id":"n2"}`), state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := srv.List(ctx, ""); err != nil {
		t.Fatalf("server listing everything: %v", err)
	}
	if err := GrantNode(ctx, srv, "n1"); err != nil {
		t.Fatal(err)
	}
	// Setting it again changes nothing (a renewal).
	if err := GrantNode(ctx, srv, "n1"); err != nil {
		t.Fatal(err)
	}

	open := func(tcfg *tls.Config) *state.Etcd {
		t.Helper()
		e, err := state.Open(ctx, state.Config{Endpoints: []string{url}, ClientTLS: tcfg, OpTimeout: 2 * time.Second, Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	denied := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: allowed, want refused", what)
		} else {
			t.Logf("%s: %v", what, err)
		}
	}

	// No certificate: the handshake fails.
	anon := open(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	_, err = anon.Put(ctx, "apikeys/k2", []byte("x"), state.WriteOptions{})
	denied("a client without a certificate writing", err)
	_, err = anon.Get(ctx, "apikeys/k1")
	denied("a client without a certificate reading", err)

	// A certificate of another CA, naming node n1: refused as well.
	other, err := pki.NewCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	forged := open(EtcdClientTLS(nodeKeypair(t, other, "n1"), ca.Verifier()))
	_, err = forged.Put(ctx, LivePrefix+"n1", []byte("x"), state.WriteOptions{})
	denied("another CA's certificate for node n1 writing its registration", err)
	for _, key := range []string{"apikeys/k2", LivePrefix + "n1"} {
		if _, err := srv.Get(ctx, key); !errors.Is(err, state.ErrNotFound) {
			t.Errorf("%s after the refused writes: %v, want not found", key, err)
		}
	}

	// Node n1's certificate: what a node agent does, for n1 alone.
	node := open(EtcdClientTLS(nodeKeypair(t, ca, "n1"), ca.Verifier()))
	if err := node.WaitReady(ctx); err != nil {
		t.Fatalf("node waiting for the store: %v", err)
	}
	if err := CheckDataKey(ctx, node, keys, false); err != nil {
		t.Fatalf("node checking the data key: %v", err)
	}
	if err := ClearStopping(ctx, node, "n1"); err != nil {
		t.Fatalf("node clearing its drain mark: %v", err)
	}
	reg, err := register(ctx, node, "n1", "127.0.0.1:8100", "i1@host")
	if err != nil {
		t.Fatalf("node n1 registering: %v", err)
	}
	if e, err := srv.Get(ctx, LivePrefix+"n1"); err != nil || e.Lease == 0 {
		t.Fatalf("n1's registration as the server reads it: %+v, %v", e, err)
	}
	if err := MarkStopping(ctx, node, "n1"); err != nil {
		t.Fatalf("node marking itself stopping: %v", err)
	}
	// Where the cluster's members are, as the node's sandboxes are kept
	// off them (agent's memberWatch): every prefix, listed and watched.
	if _, err := srv.Put(ctx, ServerPrefix+"s1", []byte(`{"hosts":["10.0.0.9"]}`), state.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range MemberPrefixes {
		if _, _, err := node.List(ctx, p); err != nil {
			t.Errorf("node n1 listing the members under %s: %v", p, err)
		}
	}
	if ents, _, err := node.List(ctx, ServerPrefix); err != nil || len(ents) != 1 {
		t.Errorf("node n1 listing the servers: %d, %v", len(ents), err)
	}
	if urls, err := node.MemberURLs(ctx); err != nil || len(urls) == 0 {
		t.Errorf("node n1 listing etcd's members: %v, %v", urls, err)
	}
	reg.Stop()
	if err := DeregisterNode(ctx, node, "n1"); err != nil {
		t.Fatalf("node deregistering: %v", err)
	}
	sess, err := node.NewSession(ctx, 10*time.Second)
	if err != nil {
		t.Fatalf("node granting a lease: %v", err)
	}
	if _, err := node.Put(ctx, LivePrefix+"n1", []byte(`{"id":"n1"}`), state.WriteOptions{Lease: sess.Lease()}); err != nil {
		t.Fatal(err)
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatalf("node revoking its lease: %v", err)
	}

	_, err = register(ctx, node, "n2", "127.0.0.1:8101", "i2@host")
	denied("node n1 registering as n2", err)
	for _, key := range []string{LivePrefix + "n2", LivePrefix + "n10", KnownPrefix + "n2", DrainPrefix + "n2", "apikeys/k3", CAKey, "sandboxes/s1"} {
		_, err := node.Put(ctx, key, []byte("x"), state.WriteOptions{})
		if !errors.Is(err, state.ErrDenied) {
			t.Errorf("node n1 writing %s: %v, want ErrDenied", key, err)
		}
	}
	if err := node.Delete(ctx, KnownPrefix+"n2", 0); !errors.Is(err, state.ErrDenied) {
		t.Errorf("node n1 deleting n2's known record: %v, want ErrDenied", err)
	}
	if _, err := node.Get(ctx, "apikeys/k1"); !errors.Is(err, state.ErrDenied) {
		t.Errorf("node n1 reading an API key: %v, want ErrDenied", err)
	}
	if _, _, err := node.List(ctx, "apikeys/"); !errors.Is(err, state.ErrDenied) {
		t.Errorf("node n1 listing the API keys: %v, want ErrDenied", err)
	}
	if _, err := node.Get(ctx, CAKey); !errors.Is(err, state.ErrDenied) {
		t.Errorf("node n1 reading the CA: %v, want ErrDenied", err)
	}
	if e, err := srv.Get(ctx, KnownPrefix+"n2"); err != nil || string(e.Value) != `{"id":"n2"}` {
		t.Fatalf("n2's record after n1's attempts: %q, %v", e.Value, err)
	}

	// Removed: the same certificate, still valid, reaches nothing.
	if err := RevokeNode(ctx, srv, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := RevokeNode(ctx, srv, "n1"); err != nil {
		t.Fatalf("removing a removed node's user: %v", err)
	}
	if _, err := node.Put(ctx, LivePrefix+"n1", []byte("x"), state.WriteOptions{}); !errors.Is(err, state.ErrDenied) {
		t.Errorf("a removed node writing its registration: %v, want ErrDenied", err)
	}
}

// TestMemberOverTLS: `aenv etcd --ca-dir` serves its client (and peer)
// URLs with a certificate of the CA in that directory, which it makes
// there at the first start: a server's certificate of that CA gets in,
// a client without one does not.
func TestMemberOverTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log := slog.New(slog.DiscardHandler)
	caDir := t.TempDir()
	ca, err := BootstrapCA(pki.Files{Dir: caDir}, true, log)
	if err != nil {
		t.Fatal(err)
	}
	client := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	mf := EtcdMemberFiles(caDir)
	member, err := OpenEtcdTLS(EtcdTLSConfig{CA: ca, Member: &mf, MemberName: "e1", MemberHosts: []string{"127.0.0.1"}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer member.Close()
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- state.RunMember(mctx, state.MemberConfig{Name: "e1", DataDir: t.TempDir(), ClientURLs: []string{client}, PeerURLs: []string{peer},
			TLS: member.MemberTLS(), PeerTLS: member.MemberTLS(), NewCluster: true}, log)
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("member: %v", err)
		}
	}()
	srvTLS, err := OpenEtcdTLS(EtcdTLSConfig{CA: ca, Client: true, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer srvTLS.Close()
	st, err := state.Open(ctx, state.Config{Endpoints: []string{client}, ClientTLS: srvTLS.ClientTLS(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Put(ctx, "k", []byte("v"), state.WriteOptions{}); err != nil {
		t.Fatalf("a server's certificate writing: %v", err)
	}
	anon, err := state.Open(ctx, state.Config{Endpoints: []string{client}, ClientTLS: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13},
		OpTimeout: time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	if _, err := anon.Get(ctx, "k"); err == nil {
		t.Fatal("a client without a certificate read a key")
	}
	// The member refuses plain http off loopback, and https without TLS.
	for _, mc := range []state.MemberConfig{
		{Name: "x", DataDir: t.TempDir(), ClientURLs: []string{"http://10.0.0.5:2379"}, PeerURLs: []string{"http://127.0.0.1:1"}},
		{Name: "x", DataDir: t.TempDir(), ClientURLs: []string{"https://127.0.0.1:1"}, PeerURLs: []string{"http://127.0.0.1:1"}},
	} {
		if err := state.RunMember(ctx, mc, log); err == nil {
			t.Errorf("member %v: started, want refused", mc.ClientURLs)
		}
	}
}
