package pki

import (
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"
)

// handshake runs a TLS handshake between a listener of server and a
// client of client, and returns the client's error and the server's.
func handshake(t *testing.T, server, client *tls.Config) (error, error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	srvErr := make(chan error, 1)
	go func() {
		s := tls.Server(a, server)
		err := s.Handshake()
		if err == nil {
			// TLS 1.3 sends the client's certificate after the client
			// finishes: a read sees the server's verdict on it.
			_, err = s.Write([]byte("x"))
		}
		srvErr <- err
		a.Close()
	}()
	c := tls.Client(b, client)
	err := c.Handshake()
	if err == nil {
		buf := make([]byte, 1)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(buf)
	}
	b.Close()
	return err, <-srvErr
}

// TestMutualTLS: a node's listener takes a server's certificate and
// refuses a node's, or none; a server dialling accepts a peer of its CA
// only.
func TestMutualTLS(t *testing.T) {
	now := time.Now()
	ca, _ := NewCA(now)
	other, _ := NewCA(now)
	node, _ := issue(t, ca, Request{Identity: Identity{Role: RoleNode, Name: "n1", Nodes: []string{"n1"}}}, now)
	srv, _ := issue(t, ca, Request{Identity: Identity{Role: RoleServer, Name: "s1"}}, now)
	foreign, _ := issue(t, other, Request{Identity: Identity{Role: RoleServer, Name: "s1"}}, now)
	listen := ServerConfig(node, ca.Verifier(), true, WantRole(RoleServer))

	if cerr, serr := handshake(t, listen, ClientConfig(srv, ca.Verifier(), nil)); cerr != nil || serr != nil {
		t.Fatalf("a server's certificate: client %v, server %v", cerr, serr)
	}
	if _, serr := handshake(t, listen, ClientConfig(node, ca.Verifier(), nil)); serr == nil {
		t.Fatal("the node's listener took a node's certificate")
	}
	if _, serr := handshake(t, listen, ClientConfig(foreign, ca.Verifier(), nil)); !errors.Is(serr, ErrUntrusted) {
		t.Fatalf("another CA's server certificate: %v, want ErrUntrusted", serr)
	}
	if _, serr := handshake(t, listen, ClientConfig(nil, ca.Verifier(), nil)); serr == nil {
		t.Fatal("the node's listener took a client without a certificate")
	}
	if cerr, _ := handshake(t, ServerConfig(foreign, other.Verifier(), false, nil), ClientConfig(srv, ca.Verifier(), nil)); !errors.Is(cerr, ErrUntrusted) {
		t.Fatalf("dialling a peer of another CA: %v, want ErrUntrusted", cerr)
	}
}
