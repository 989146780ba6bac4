package proxy

import (
	"context"
	"net"
	"net/http"
)

// ViaDialer reaches the node agents requests are forwarded through
// (Route.Via) where a plain TCP connection and the same headers for
// every node do not fit: a node that serves mutual TLS gets a TLS
// connection checked against its id, and no cluster token.
type ViaDialer interface {
	// DialVia connects to the node agent at address.
	DialVia(ctx context.Context, address string) (net.Conn, error)
	// ViaHeader is what requests through the node agent at address
	// carry, instead of New's via headers (which clients' requests are
	// still stripped of).
	ViaHeader(address string) http.Header
}

// SetVia makes the proxy reach node agents through v. Call it before the
// proxy serves.
func (p *Proxy) SetVia(v ViaDialer) { p.via = v }
