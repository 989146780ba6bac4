package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/pki"
)

// TestAPITLS: how the API listener serves for each listen address and
// flag, and that the certificate of the cluster's CA it serves beyond
// loopback verifies for the domain, the sandbox hosts under it and the
// listening address, and is renewed in place.
func TestAPITLS(t *testing.T) {
	ca, err := pki.NewCA(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Certificate())
	newServer := func(t *testing.T, cfg Config) *Server {
		tr := &trust{ca: ca, log: slog.Default()}
		tr.bg, tr.cancel = context.WithCancel(context.Background())
		t.Cleanup(func() { tr.cancel(); tr.renewals.Wait() })
		return &Server{cfg: cfg, log: slog.Default(), trust: tr}
	}
	addr := func(s string) net.Addr {
		a, err := net.ResolveTCPAddr("tcp", s)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}

	for _, c := range []struct {
		name   string
		cfg    Config
		listen string
		tls    bool
	}{
		{"loopback", Config{}, "127.0.0.1:8000", false},
		{"loopback v6", Config{}, "[::1]:8000", false},
		{"loopback with --https", Config{HTTPS: true}, "127.0.0.1:8000", true},
		{"every address", Config{}, "0.0.0.0:8000", true},
		{"an address", Config{}, "10.1.2.3:8000", true},
		{"--insecure-http", Config{InsecureHTTP: true}, "0.0.0.0:8000", false},
		{"--insecure-http with --https", Config{InsecureHTTP: true, HTTPS: true}, "0.0.0.0:8000", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := newServer(t, c.cfg).apiTLS(addr(c.listen), "sbx.example.test")
			if err != nil || (got != nil) != c.tls {
				t.Fatalf("apiTLS(%s) = %v, %v; want TLS %v", c.listen, got, err, c.tls)
			}
		})
	}

	t.Run("the CA's certificate", func(t *testing.T) {
		cfg := Config{}
		cfg.Trust.CertLifetime = 3 * time.Second
		cfg.Advertise = "api.example.test:8000"
		tc, err := newServer(t, cfg).apiTLS(addr("10.1.2.3:8000"), "sbx.example.test:8000")
		if err != nil {
			t.Fatal(err)
		}
		leaf := func() *x509.Certificate {
			c, err := tc.GetCertificate(&tls.ClientHelloInfo{})
			if err != nil {
				t.Fatal(err)
			}
			l, err := x509.ParseCertificate(c.Certificate[0])
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		first := leaf()
		for _, name := range []string{"sbx.example.test", "49983-i0abc.sbx.example.test", "api.example.test", "10.1.2.3", "localhost", "127.0.0.1"} {
			if _, err := first.Verify(x509.VerifyOptions{DNSName: name, Roots: roots}); err != nil {
				t.Errorf("the certificate does not verify for %s: %v", name, err)
			}
		}
		if _, err := first.Verify(x509.VerifyOptions{DNSName: "other.test", Roots: roots}); err == nil {
			t.Error("the certificate verifies for a name it was not issued for")
		}
		if id := pki.IdentityOf(first); id.Role != pki.RoleAPI || len(id.Nodes) != 0 {
			t.Errorf("the API certificate's identity is %+v: members would take it for one of theirs", id)
		}
		if len(first.ExtKeyUsage) != 1 || first.ExtKeyUsage[0] != x509.ExtKeyUsageServerAuth {
			t.Errorf("the API certificate's key usage is %v, want server auth only", first.ExtKeyUsage)
		}
		// Renewed at two thirds of its life, in place.
		deadline := time.Now().Add(10 * time.Second)
		for leaf().SerialNumber.Cmp(first.SerialNumber) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the API certificate was not renewed")
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("the operator's certificate", func(t *testing.T) {
		dir := t.TempDir()
		key, err := pki.NewKey()
		if err != nil {
			t.Fatal(err)
		}
		certPEM, err := ca.Issue(&key.PublicKey, pki.Request{Identity: pki.Identity{Role: pki.RoleAPI, Name: "ops"}, Hosts: []string{"ops.example.test"}}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		certFile, keyFile := filepath.Join(dir, "api.crt"), filepath.Join(dir, "api.key")
		if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keyFile, pki.KeyPEM(key), 0o600); err != nil {
			t.Fatal(err)
		}
		// On loopback too: an operator's certificate is always served.
		tc, err := newServer(t, Config{TLSCert: certFile, TLSKey: keyFile}).apiTLS(addr("127.0.0.1:8000"), "")
		if err != nil || tc == nil || len(tc.Certificates) != 1 {
			t.Fatalf("with --tls-cert and --tls-key: %v, %v", tc, err)
		}
		for _, bad := range []Config{{TLSCert: certFile}, {TLSKey: keyFile}, {TLSCert: keyFile, TLSKey: certFile}} {
			if _, err := newServer(t, bad).apiTLS(addr("127.0.0.1:8000"), ""); err == nil || !strings.Contains(err.Error(), "--tls-") {
				t.Errorf("apiTLS(cert %q, key %q) = %v, want an error naming the flags", bad.TLSCert, bad.TLSKey, err)
			}
		}
	})
}
