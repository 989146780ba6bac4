package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/testutil"
)

// tlsCluster is a pure API server with a cluster listener, and how to
// start node agents that join it with `join-command`'s line.
type tlsCluster struct {
	srv    *Server
	c      *client.Client
	dir    string
	log    *slog.Logger
	runsc  string
	base   string
	binDir string
}

func startTLSCluster(tb testing.TB, lifetime time.Duration) *tlsCluster {
	tb.Helper()
	testutil.RequireRoot(tb)
	tc := &tlsCluster{runsc: testutil.RequireBinary(tb, "runsc", "AENV_RUNSC"), dir: tb.TempDir(),
		base: os.Getenv("AENV_BASE_ROOTFS"), binDir: os.Getenv("AENV_BIN_DIR"),
		log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	if tc.base == "" || tc.binDir == "" {
		testutil.Unavailable(tb, "AENV_BASE_ROOTFS and AENV_BIN_DIR must be set (make build base)")
	}
	cfg := Config{NoLocalNode: true, Trust: TrustConfig{ClusterListen: "127.0.0.1:0", CertLifetime: lifetime}, Config: agent.Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(tc.dir, "api"), RunDir: filepath.Join(tc.dir, "api-run"),
		StoreURL: filepath.Join(tc.dir, "shared-store"), BaseRootFS: tc.base,
		// The cluster's etcd over TLS with its CA: nodes that join reach it
		// with their certificates, as their own etcd users.
		EtcdClientURLs: []string{fmt.Sprintf("https://127.0.0.1:%d", freePort(tb))}, OnStop: cluster.StopKill, Logger: tc.log,
	}}
	var err error
	if tc.srv, err = Start(context.Background(), cfg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tc.srv.Close(context.Background()) })
	tc.c = client.New("http://"+tc.srv.Addr().String(), tc.srv.APIKey())
	return tc
}

// joinCommand asks for a join command and returns its --join, --token
// and --ca-hash.
func (tc *tlsCluster) joinCommand(tb testing.TB, ttl time.Duration) (url, token, hash string) {
	tb.Helper()
	jc, err := tc.c.CreateJoinToken(context.Background(), ttl, "test")
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(jc.Command)
	if len(f) != 8 || f[0] != "aenv" || f[1] != "node" || f[2] != "--join" || f[4] != "--token" || f[6] != "--ca-hash" {
		tb.Fatalf("join command %q", jc.Command)
	}
	if !strings.HasPrefix(f[3], "https://") || !strings.HasPrefix(f[7], "sha256:") {
		tb.Fatalf("join command %q: want an https URL and a sha256 CA hash", jc.Command)
	}
	return f[3], f[5], f[7]
}

func (tc *tlsCluster) nodeConfig(id, url, token, hash string) agent.Config {
	n := tagCounter.Add(1)
	return agent.Config{
		Join: url, ClusterToken: token, CAHash: hash, Listen: "127.0.0.1:0", NodeID: id,
		DataDir: filepath.Join(tc.dir, id), RunDir: filepath.Join(tc.dir, id+"-run"),
		RunscPath: tc.runsc, EnvdPath: filepath.Join(tc.binDir, "envd"), BaseRootFS: tc.base,
		SandboxCIDR: fmt.Sprintf("10.23%d.0.0/16", 2+n%7), NetnsTag: "tls" + string(rune('a'+n%26)),
		NetnsPoolSize: 1, StoreURL: filepath.Join(tc.dir, "shared-store"), OnStop: cluster.StopKill, Logger: tc.log,
	}
}

func (tc *tlsCluster) join(tb testing.TB, id string) *agent.Agent {
	tb.Helper()
	url, token, hash := tc.joinCommand(tb, time.Hour)
	a, err := agent.Start(context.Background(), tc.nodeConfig(id, url, token, hash))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { a.Close(context.Background()) })
	waitReady(tb, tc.c, id)
	return a
}

func waitReady(tb testing.TB, c *client.Client, id string) {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		nodes, err := c.Nodes(context.Background())
		for _, n := range nodes {
			if n.ID == id && n.State == "ready" {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("node %s is not ready: %+v %v", id, nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// servedSerial is the serial of the certificate the node at addr serves,
// to a client presenting kp.
func servedSerial(t *testing.T, addr string, kp *pki.Keypair) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, GetClientCertificate: kp.GetClientCertificate})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
}

// TestTLSJoinAndMutualTLS: nodes join with `aenv cluster join-command`'s
// line. A wrong --ca-hash is refused before anything is sent; expired and
// revoked join tokens are refused. The joined node serves mutual TLS to
// servers only, and a command runs through the server over that hop. A
// certificate of another CA, or of another node id, is refused where the
// server dials a node. Certificates are renewed (lifetime 15 s) while
// commands keep running; once the node is removed its certificate is
// refused, its connections cut, and its renewal refused.
func TestTLSJoinAndMutualTLS(t *testing.T) {
	const lifetime = 15 * time.Second
	tc := startTLSCluster(t, lifetime)
	ctx := context.Background()

	url, token, hash := tc.joinCommand(t, time.Hour)
	other, _ := pki.NewCA(time.Now())
	if _, err := agent.Start(ctx, tc.nodeConfig("wronghash", url, token, other.Hash())); err == nil || !errors.Is(err, pki.ErrUntrusted) {
		t.Fatalf("a wrong --ca-hash: %v, want ErrUntrusted", err)
	}
	if n := tc.srv.trust.joins.Load(); n != 0 {
		t.Fatalf("the server saw %d join requests from a node with the wrong CA hash", n)
	}
	_, short, _ := tc.joinCommand(t, time.Second)
	_, revoked, _ := tc.joinCommand(t, time.Hour)
	if err := tc.c.RevokeJoinToken(ctx, strings.Split(revoked, ".")[0]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	for name, tok := range map[string]string{"expired": short, "revoked": revoked} {
		if _, err := agent.Start(ctx, tc.nodeConfig("bad"+name, url, tok, hash)); err == nil || !strings.Contains(err.Error(), "401") {
			t.Fatalf("a join with an %s token: %v, want refused (401)", name, err)
		}
	}
	if toks, err := tc.c.JoinTokens(ctx); err != nil || len(toks) != 1 {
		t.Fatalf("join tokens listed: %+v %v (want the one unexpired, unrevoked)", toks, err)
	}

	nodeAgent := tc.join(t, "tlsnode")
	e, err := tc.srv.state.Get(ctx, membership.LivePrefix+"tlsnode")
	var info membership.NodeInfo
	if err != nil || json.Unmarshal(e.Value, &info) != nil || !info.TLS {
		t.Fatalf("the node's registration: %s %v, want TLS", e.Value, err)
	}
	addr := nodeAgent.Addr().String()
	for _, f := range []string{"node.key", "node.crt", "ca.crt"} {
		if st, err := os.Stat(filepath.Join(tc.dir, "tlsnode", "secrets", f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want mode 0600", f, st, err)
		}
	}

	// The node refuses callers without a server's certificate: none, or
	// a node's.
	if resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}).Get("https://" + addr + "/metrics"); err == nil {
		resp.Body.Close()
		t.Fatalf("a caller without a certificate got %d", resp.StatusCode)
	}
	nodeCert, nodeKey, caPEM, err := pki.Files{Dir: filepath.Join(tc.dir, "tlsnode", "secrets"), Name: "node"}.Load()
	if err != nil {
		t.Fatal(err)
	}
	nodeKP, _ := pki.NewKeypair(nodeCert, nodeKey, caPEM)
	asNode := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, GetClientCertificate: nodeKP.GetClientCertificate}}}
	if resp, err := asNode.Post("https://"+addr+"/node.v1.NodeService/List", "application/json", strings.NewReader("{}")); err == nil {
		resp.Body.Close()
		t.Fatalf("a caller with a node's certificate got %d", resp.StatusCode)
	}

	// Another CA's certificate, or this CA's for another node id, is
	// refused where the server dials node tlsnode.
	for name, ca := range map[string]*pki.CA{"another CA": other, "another id": tc.srv.trust.ca} {
		key, _ := pki.NewKey()
		id := "tlsnode"
		if name == "another id" {
			id = "impostor"
		}
		certPEM, _ := ca.Issue(&key.PublicKey, pki.Request{Identity: pki.Identity{Role: pki.RoleNode, Name: id, Nodes: []string{id}}}, time.Now())
		kp, _ := pki.NewKeypair(certPEM, key, ca.CertPEM())
		l, err := tls.Listen("tcp", "127.0.0.1:0", pki.ServerConfig(kp, ca.Verifier(), false, nil))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				go func() { _ = c.(*tls.Conn).Handshake(); c.Close() }()
			}
		}()
		if c, err := tc.srv.trust.dialNode(ctx, "tlsnode", l.Addr().String()); err == nil || !errors.Is(err, pki.ErrUntrusted) {
			if c != nil {
				c.Close()
			}
			t.Errorf("a node certificate of %s: %v, want ErrUntrusted", name, err)
		}
		l.Close()
	}

	sb := mustCreate(t, tc.c, client.CreateOptions{Timeout: 300})
	if got := runWithin(t, tc.c, sb.SandboxID, "echo over mtls", 30*time.Second); got != "over mtls" {
		t.Fatalf("exec over the mTLS hop: %q", got)
	}

	// Renewal: past a lifetime, the node serves a new certificate, and
	// commands ran all along.
	first := servedSerial(t, addr, tc.srv.trust.kp)
	serverFirst := tc.srv.trust.kp.Leaf().SerialNumber.String()
	deadline := time.Now().Add(lifetime + 5*time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		want := fmt.Sprintf("n%d", i)
		if got := runWithin(t, tc.c, sb.SandboxID, "echo "+want, 10*time.Second); got != want {
			t.Fatalf("exec %d during renewal: %q", i, got)
		}
		time.Sleep(300 * time.Millisecond)
	}
	if servedSerial(t, addr, tc.srv.trust.kp) == first {
		t.Fatal("the node serves the same certificate after its lifetime")
	}
	if tc.srv.trust.kp.Leaf().SerialNumber.String() == serverFirst {
		t.Fatal("the server's own certificate was not renewed")
	}
	if got := runWithin(t, tc.c, sb.SandboxID, "echo renewed", 10*time.Second); got != "renewed" {
		t.Fatalf("exec after renewal: %q", got)
	}

	// Removal: the node's certificate is refused from then on.
	if err := tc.c.RemoveNode(ctx, "tlsnode"); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		c, err := tc.srv.trust.dialNode(ctx, "tlsnode", addr)
		if err != nil && errors.Is(err, membership.ErrNodeRemoved) {
			break
		}
		if c != nil {
			c.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("dialling a removed node: %v, want ErrNodeRemoved", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	var out bytes.Buffer
	code, err := tc.c.Run(rctx, sb.SandboxID, "echo removed", client.RunOptions{Stdout: &out})
	cancel()
	if err == nil && code == 0 {
		t.Fatalf("exec on a removed node's sandbox worked: %q", out.String())
	}
	nodeCert, nodeKey, caPEM, _ = pki.Files{Dir: filepath.Join(tc.dir, "tlsnode", "secrets"), Name: "node"}.Load()
	nodeKP, _ = pki.NewKeypair(nodeCert, nodeKey, caPEM)
	csr, _ := pki.NewCSR(nodeKey)
	body, _ := json.Marshal(membership.JoinRequest{CSR: string(csr)})
	renewer := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, GetClientCertificate: nodeKP.GetClientCertificate}}}
	resp, err := renewer.Post("https://"+tc.srv.ClusterAddr().String()+membership.RenewPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("renewing a removed node's certificate: %d, want 403", resp.StatusCode)
	}
}
