package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/state"
)

// fakeNode answers only ID and Info, all a registration's reporter asks.
type fakeNode struct {
	nodeapi.Node
	id string
}

func (n fakeNode) ID() string { return n.id }
func (n fakeNode) Info(context.Context, *nodev1.InfoRequest) (*nodev1.NodeInfo, error) {
	return &nodev1.NodeInfo{Id: n.id}, nil
}

// tlsJoinAs posts a join for id of instance with token to the cluster
// listener at url, returning the status, the answer and the node's key.
func tlsJoinAs(t *testing.T, url, token, id, instance string) (int, membership.JoinAnswer, string, *pki.Keypair) {
	t.Helper()
	key, err := pki.NewKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(membership.JoinRequest{Token: token, NodeID: id, Instance: instance, CSR: string(csr)})
	// The CA hash check is the agent's (TestTLSJoinAndMutualTLS); this
	// test is about what the certificate reaches in etcd.
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := hc.Post(url+membership.TLSJoinPath, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var ans membership.JoinAnswer
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, ans, string(b), nil
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		t.Fatal(err)
	}
	kp, err := pki.NewKeypair([]byte(ans.Certificate), key, []byte(ans.CA))
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, ans, string(b), kp
}

// TestEtcdOverTLSJoin: a server whose embedded etcd listens on https
// (--etcd-listen) serves it with a certificate of the cluster's CA and
// RBAC on. A node that joins with a join token is handed the https
// endpoints and a certificate that reaches etcd as its own user: it
// registers under its id, and reads no secret. A second join for the id
// of that live node, from another instance, is refused naming the id and
// the address that holds it; the old join with the cluster token is
// refused (such a node has no certificate for etcd). Once the node is
// removed, its certificate reaches nothing in etcd. The server starts
// again on the same data (its CA from its files, etcd's auth on).
// pureTLSEtcdConfig is a pure API server's, its data in dir/<data> and
// dir/<run>, the store in dir/store, its embedded etcd serving etcdURL.
func pureTLSEtcdConfig(dir, data, run, etcdURL string, log *slog.Logger) Config {
	return Config{NoLocalNode: true, Trust: TrustConfig{ClusterListen: "127.0.0.1:0"}, Config: agent.Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, data), RunDir: filepath.Join(dir, run),
		StoreURL: filepath.Join(dir, "store"), EtcdClientURLs: []string{etcdURL}, OnStop: cluster.StopKill, Logger: log,
	}}
}

func TestEtcdOverTLSJoin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	etcdURL := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	cfg := pureTLSEtcdConfig(dir, "api", "run", etcdURL, log)
	srv, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if srv != nil {
			srv.Close(context.Background())
		}
	}()
	if on, err := srv.state.AuthEnabled(ctx); err != nil || !on {
		t.Fatalf("etcd auth after the server's start: %v, %v", on, err)
	}
	c := client.New("http://"+srv.Addr().String(), srv.APIKey())
	jc, err := c.CreateJoinToken(ctx, time.Hour, "test")
	if err != nil {
		t.Fatal(err)
	}

	code, ans, body, kp := tlsJoinAs(t, jc.URL, jc.Token, "n1", "i1@host1")
	if code != http.StatusOK {
		t.Fatalf("join as n1: %d %s", code, body)
	}
	if len(ans.EtcdEndpoints) != 1 || ans.EtcdEndpoints[0] != etcdURL {
		t.Fatalf("etcd endpoints handed over: %v, want [%s]", ans.EtcdEndpoints, etcdURL)
	}
	if id := pki.IdentityOf(kp.Leaf()); id.CommonName() != membership.NodeUser("n1") {
		t.Fatalf("the node's certificate names %s, want %s", id.CommonName(), membership.NodeUser("n1"))
	}
	v, err := pki.NewVerifier([]byte(ans.CA))
	if err != nil {
		t.Fatal(err)
	}
	nodeSt, err := state.Open(ctx, state.Config{Endpoints: ans.EtcdEndpoints, ClientTLS: membership.EtcdClientTLS(kp, v), OpTimeout: 2 * time.Second, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer nodeSt.Close()
	if err := nodeSt.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	const addr = "127.0.0.1:18100"
	reg, err := membership.RegisterNode(ctx, nodeSt, membership.InstanceReporter(fakeNode{id: "n1"}, addr, "i1@host1"), log)
	if err != nil {
		t.Fatalf("node n1 registering with its certificate: %v", err)
	}
	defer reg.Stop()
	if _, _, err := nodeSt.List(ctx, "apikeys/"); !errors.Is(err, state.ErrDenied) {
		t.Errorf("node n1 listing the API keys: %v, want ErrDenied", err)
	}
	if _, err := nodeSt.Get(ctx, membership.CAKey); !errors.Is(err, state.ErrDenied) {
		t.Errorf("node n1 reading the CA's record: %v, want ErrDenied", err)
	}
	if _, err := nodeSt.Put(ctx, membership.LivePrefix+"n2", []byte(`{"id":"n2"}`), state.WriteOptions{}); !errors.Is(err, state.ErrDenied) {
		t.Errorf("node n1 writing n2's registration: %v, want ErrDenied", err)
	}

	// Another instance asking for n1's certificate while n1 lives.
	jc2, err := c.CreateJoinToken(ctx, time.Hour, "test")
	if err != nil {
		t.Fatal(err)
	}
	code, _, body, _ = tlsJoinAs(t, jc2.URL, jc2.Token, "n1", "i2@host2")
	if code != http.StatusConflict || !strings.Contains(body, "n1") || !strings.Contains(body, addr) {
		t.Fatalf("a join for live n1 by another instance: %d %s, want 409 naming n1 and %s", code, body, addr)
	}
	// The same instance joining again (its restart) is not refused.
	if code, _, body, _ = tlsJoinAs(t, jc2.URL, jc2.Token, "n1", "i1@host1"); code != http.StatusOK {
		t.Fatalf("n1 joining again from its own instance: %d %s", code, body)
	}

	// The old join, with the cluster token, cannot reach such an etcd.
	token, err := os.ReadFile(membership.ClusterTokenPath(cfg.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.Addr().String()+membership.JoinPath, nil)
	req.Header.Set(nodeapi.TokenHeader, strings.TrimSpace(string(token)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(b), "join over TLS") {
		t.Fatalf("the old join: %d %s, want 409 telling to join over TLS", resp.StatusCode, b)
	}

	reg.Stop()
	if err := c.RemoveNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := nodeSt.Put(ctx, membership.LivePrefix+"n1", []byte(`{"id":"n1"}`), state.WriteOptions{}); !errors.Is(err, state.ErrDenied) {
		t.Errorf("removed node n1 writing its registration: %v, want ErrDenied", err)
	}

	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if srv, err = Start(ctx, cfg); err != nil {
		t.Fatalf("starting again on the same data: %v", err)
	}
	c = client.New("http://"+srv.Addr().String(), srv.APIKey())
	if _, err := c.Nodes(ctx); err != nil {
		t.Fatalf("the restarted server: %v", err)
	}

	// Without https, the member keeps its auth: the start fails, saying so.
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	plain := cfg
	plain.EtcdClientURLs = nil
	if srv, err = Start(ctx, plain); err == nil || !errors.Is(err, state.ErrDenied) || !strings.Contains(err.Error(), "https") {
		t.Fatalf("starting on the unix socket after https: %v, want ErrDenied telling to reach it over https", err)
	}
	t.Logf("without https: %v", err)
	srv = nil
}
