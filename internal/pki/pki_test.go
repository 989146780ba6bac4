package pki

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// chainOf is the chain kp presents in a handshake.
func chainOf(t *testing.T, kp *Keypair) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for _, der := range kp.cur.Load().Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

func issue(t *testing.T, ca *CA, r Request, now time.Time) (*Keypair, []byte) {
	t.Helper()
	key, err := NewKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := NewCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := ca.IssueCSR(csr, r, now)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := NewKeypair(certPEM, key, ca.CertPEM())
	if err != nil {
		t.Fatal(err)
	}
	return kp, certPEM
}

// TestIssueAndVerify: a node certificate names its id for etcd (CN) and
// for servers (URI SAN); it verifies against its CA until it expires, and
// never against another CA.
func TestIssueAndVerify(t *testing.T) {
	now := time.Now()
	ca, err := NewCA(now)
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := issue(t, ca, Request{Identity: Identity{Role: RoleNode, Name: "n1", Nodes: []string{"n1"}}, Lifetime: time.Hour}, now)
	leaf := kp.Leaf()
	if leaf.Subject.CommonName != "node:n1" || leaf.Subject.Organization[0] != RoleNode {
		t.Fatalf("subject %v, want CN node:n1 O %s", leaf.Subject, RoleNode)
	}
	_, id, err := ca.Verifier().Verify(chainOf(t, kp), now)
	if err != nil {
		t.Fatal(err)
	}
	if id.Role != RoleNode || id.Name != "n1" || !id.Serves("n1") || id.Serves("n2") {
		t.Fatalf("identity %+v", id)
	}
	if _, _, err := ca.Verifier().Verify(chainOf(t, kp), now.Add(2*time.Hour)); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("an expired certificate: %v, want ErrUntrusted", err)
	}
	other, _ := NewCA(now)
	if _, _, err := other.Verifier().Verify(chainOf(t, kp), now); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("another CA's certificate: %v, want ErrUntrusted", err)
	}
	if got := RenewAt(leaf); got.Before(now.Add(35*time.Minute)) || got.After(now.Add(41*time.Minute)) {
		t.Fatalf("renew at %s, want about two thirds of an hour from now", got.Sub(now))
	}
}

// TestNodeMayServeOnlyItself: a node certificate for another id than its
// name, or several, is not issued; a server's may serve its local node.
func TestNodeMayServeOnlyItself(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA(now)
	key, _ := NewKey()
	if _, err := ca.Issue(&key.PublicKey, Request{Identity: Identity{Role: RoleNode, Name: "n1", Nodes: []string{"n2"}}}, now); err == nil {
		t.Fatal("issued node n1 a certificate serving n2")
	}
	kp, _ := issue(t, ca, Request{Identity: Identity{Role: RoleServer, Name: "s1", Nodes: []string{"local/1"}}, Hosts: []string{"127.0.0.1", "localhost"}}, now)
	id := IdentityOf(kp.Leaf())
	if id.Role != RoleServer || id.Name != "s1" || !id.Serves("local/1") || id.CommonName() != "server:s1" {
		t.Fatalf("server identity %+v", id)
	}
	if got := kp.Leaf().NotAfter.Sub(now); got < DefaultLifetime-time.Minute || got > DefaultLifetime {
		t.Fatalf("default lifetime %s", got)
	}
}

// TestHash: the hash is kubeadm's (SHA-256 of the SubjectPublicKeyInfo),
// and pinning it finds the CA in a chain, or refuses a chain without it.
func TestHash(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA(now)
	sum := sha256.Sum256(ca.Certificate().RawSubjectPublicKeyInfo)
	if want := "sha256:" + hex.EncodeToString(sum[:]); ca.Hash() != want || len(ca.Hash()) != 71 {
		t.Fatalf("hash %s, want %s", ca.Hash(), want)
	}
	kp, _ := issue(t, ca, Request{Identity: Identity{Role: RoleServer, Name: "s1"}}, now)
	v, _, id, err := PinnedVerifier(chainOf(t, kp), ca.Hash(), now)
	if err != nil || id.Role != RoleServer || v.Hash() != ca.Hash() {
		t.Fatalf("pinned: %+v %v", id, err)
	}
	other, _ := NewCA(now)
	if _, _, _, err := PinnedVerifier(chainOf(t, kp), other.Hash(), now); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("a wrong hash: %v, want ErrUntrusted", err)
	}
	// A chain that carries a CA of the right hash but a leaf it did not
	// sign is refused too.
	forged, _ := issue(t, other, Request{Identity: Identity{Role: RoleServer, Name: "evil"}}, now)
	chain := append(chainOf(t, forged)[:1], ca.Certificate())
	if _, _, _, err := PinnedVerifier(chain, ca.Hash(), now); !errors.Is(err, ErrUntrusted) {
		t.Fatalf("a leaf of another CA beside this CA: %v, want ErrUntrusted", err)
	}
}

// TestParseCAAndFiles: a CA and a keypair survive their files, which only
// their owner reads; a CA key that is not the certificate's is refused.
func TestParseCAAndFiles(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA(now)
	again, err := ParseCA(ca.CertPEM(), ca.KeyPEM())
	if err != nil || again.Hash() != ca.Hash() {
		t.Fatalf("parsed CA: %v", err)
	}
	other, _ := NewCA(now)
	if _, err := ParseCA(ca.CertPEM(), other.KeyPEM()); err == nil {
		t.Fatal("a CA with another's key was accepted")
	}
	f := Files{Dir: filepath.Join(t.TempDir(), "secrets"), Name: "node"}
	kp, certPEM := issue(t, ca, Request{Identity: Identity{Role: RoleNode, Name: "n1", Nodes: []string{"n1"}}}, now)
	if err := f.Store(certPEM, kp.Key(), ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{f.CertPath(), f.KeyPath(), f.CAPath()} {
		if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want mode 0600", p, st.Mode(), err)
		}
	}
	c, k, caPEM, err := f.Load()
	if err != nil || !k.Equal(kp.Key()) || string(c) != string(certPEM) || !strings.Contains(string(caPEM), "CERTIFICATE") {
		t.Fatalf("loaded: %v", err)
	}
	if _, _, _, err := (Files{Dir: t.TempDir(), Name: "node"}).Load(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("no files: %v, want ErrNotExist", err)
	}
}

// TestKeypairReload: a TLS config reading the keypair serves the new
// certificate once it is set, without being rebuilt.
func TestKeypairReload(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA(now)
	kp, _ := issue(t, ca, Request{Identity: Identity{Role: RoleNode, Name: "n1", Nodes: []string{"n1"}}}, now)
	cfg := &tls.Config{GetCertificate: kp.GetCertificate}
	first, _ := cfg.GetCertificate(nil)
	key, _ := NewKey()
	csr, _ := NewCSR(key)
	certPEM, err := ca.IssueCSR(csr, Request{Identity: Identity{Role: RoleNode, Name: "n1", Nodes: []string{"n1"}}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := kp.Set(certPEM, kp.Key(), ca.CertPEM()); err == nil {
		t.Fatal("a certificate for another key was accepted")
	}
	if err := kp.Set(certPEM, key, ca.CertPEM()); err != nil {
		t.Fatal(err)
	}
	second, _ := cfg.GetCertificate(nil)
	if first.Leaf.SerialNumber.Cmp(second.Leaf.SerialNumber) == 0 || len(second.Certificate) != 2 {
		t.Fatalf("after Set the config serves serial %s (chain %d), before %s", second.Leaf.SerialNumber, len(second.Certificate), first.Leaf.SerialNumber)
	}
	if _, err := ca.IssueCSR([]byte("junk"), Request{Identity: Identity{Role: RoleNode, Name: "n1", Nodes: []string{"n1"}}}, now); err == nil {
		t.Fatal("junk was accepted as a certificate request")
	}
}
