package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/state"
)

// TrustConfig is a server's part in the cluster's PKI.
type TrustConfig struct {
	// ClusterListen is the address of the cluster listener (TLS with the
	// server's certificate of the cluster CA): node joins with join
	// tokens, certificate renewals, and the local node's API and traffic
	// for the other servers (mutual TLS). Empty: none; nodes then join
	// only the old way, and the local node is reached at the API's port.
	ClusterListen string
	// ClusterListenDefaulted: ClusterListen is the default, not the
	// operator's choice, so that a port in use (a second server on the
	// host) leaves the server without a cluster listener, with a
	// warning, instead of failing its start.
	ClusterListenDefaulted bool
	// ClusterAdvertise is the host:port others reach the cluster listener
	// at (default: ClusterListen where it names a host).
	ClusterAdvertise string
	// CertLifetime is the life of the certificates issued (0:
	// pki.DefaultLifetime); they are renewed at two thirds of it.
	CertLifetime time.Duration
}

// trust is a running server's certificates: the cluster's CA, its own
// certificate (renewed in the background), the removed nodes, and the
// TLS transports it reaches nodes with.
type trust struct {
	ca       *pki.CA
	verifier *pki.Verifier
	kp       *pki.Keypair
	removals *membership.Removals
	nodes    *nodeDirectory
	lifetime time.Duration
	request  pki.Request
	log      *slog.Logger

	// legacy carries the cluster token to nodes without a certificate,
	// which insecure allows off loopback (--insecure-cluster).
	legacy   http.RoundTripper
	insecure bool

	mu         sync.Mutex
	transports map[string]*http.Transport // by node id
	// conns are the open TLS connections to each node (the node API's
	// and the proxy's), cut when the node is removed.
	conns map[string]map[*nodeConn]struct{}
	// joins counts the TLS join requests served (for tests: a join that
	// failed its CA check sent none).
	joins atomic.Int64
	// dials counts the TLS connections made to nodes (for benchmarks: a
	// hop that reuses its connections makes few).
	dials atomic.Int64

	// bg is the renewals' context, cancelled at close; renewals are
	// the goroutines renewing this server's certificates.
	bg       context.Context
	cancel   context.CancelFunc
	renewals sync.WaitGroup
}

// openTrust loads (or creates) the cluster's CA and issues this server a
// certificate naming localNode ("" without one).
func openTrust(ctx context.Context, st state.Store, cfg Config, localNode string, legacy http.RoundTripper, log *slog.Logger) (_ *trust, err error) {
	ca, err := membership.LoadCA(ctx, st, cfg.dataKeys, cfg.DataDir, log)
	if err != nil {
		return nil, err
	}
	hostname, _ := os.Hostname()
	t := &trust{ca: ca, verifier: ca.Verifier(), lifetime: cfg.Trust.CertLifetime, log: log, legacy: legacy, insecure: cfg.InsecureCluster,
		transports: map[string]*http.Transport{}, conns: map[string]map[*nodeConn]struct{}{}}
	t.request = pki.Request{Identity: pki.Identity{Role: pki.RoleServer, Name: hostname + ":" + cfg.DataDir}, Lifetime: t.lifetime,
		Hosts: []string{"localhost", "127.0.0.1", "::1", hostname}}
	if localNode != "" {
		t.request.Nodes = []string{localNode}
	}
	for _, a := range []string{cfg.Trust.ClusterAdvertise, cfg.Trust.ClusterListen} {
		if h, _, err := net.SplitHostPort(a); err == nil && h != "" {
			t.request.Hosts = append(t.request.Hosts, h)
		}
	}
	if t.kp, err = t.issue(t.request); err != nil {
		return nil, err
	}
	if t.removals, err = membership.WatchRemovals(ctx, st, t.forget, log); err != nil {
		return nil, err
	}
	if t.nodes, err = watchNodes(ctx, st, log); err != nil {
		t.removals.Close()
		return nil, err
	}
	t.bg, t.cancel = context.WithCancel(context.WithoutCancel(ctx))
	t.keep(t.request, t.kp)
	return t, nil
}

// issue makes a key and a certificate of req for it.
func (t *trust) issue(req pki.Request) (*pki.Keypair, error) {
	key, err := pki.NewKey()
	if err != nil {
		return nil, err
	}
	certPEM, err := t.ca.Issue(&key.PublicKey, req, time.Now())
	if err != nil {
		return nil, err
	}
	return pki.NewKeypair(certPEM, key, t.ca.CertPEM())
}

// keep renews kp, a certificate of req, until close.
func (t *trust) keep(req pki.Request, kp *pki.Keypair) {
	t.renewals.Add(1)
	go func() {
		defer t.renewals.Done()
		t.renewLoop(t.bg, req, kp)
	}()
}

// renewLoop issues kp a new certificate of req at two thirds of the
// current one's life: the server holds the CA, so a renewal is local.
func (t *trust) renewLoop(ctx context.Context, req pki.Request, kp *pki.Keypair) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(pki.RenewAt(kp.Leaf()))):
		}
		key, err := pki.NewKey()
		if err == nil {
			var certPEM []byte
			if certPEM, err = t.ca.Issue(&key.PublicKey, req, time.Now()); err == nil {
				err = kp.Set(certPEM, key, t.ca.CertPEM())
			}
		}
		if err != nil {
			t.log.Error("renewing a certificate of this server", "common_name", req.CommonName(), "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
}

// close stops the renewals and the watches, and closes the transports.
func (t *trust) close() {
	if t == nil {
		return
	}
	t.cancel()
	t.renewals.Wait()
	t.removals.Close()
	t.nodes.close()
	// Closed outside the lock: closing a connection takes it (nodeConn).
	t.mu.Lock()
	trs := t.transports
	t.transports = map[string]*http.Transport{}
	t.mu.Unlock()
	for _, tr := range trs {
		tr.CloseIdleConnections()
	}
}

// acceptNode accepts a certificate that may answer as node id: of the
// cluster's CA (checked before), serving id, and not of a removed node.
func (t *trust) acceptNode(id string) pki.Accept {
	return func(leaf *x509.Certificate, got pki.Identity) error {
		if !got.Serves(id) {
			return fmt.Errorf("%w: dialling node %s, the peer's certificate is %s's (serving %v)", pki.ErrUntrusted, id, got.CommonName(), got.Nodes)
		}
		if t.removals.Refused(id, pki.IssuedAt(leaf)) {
			return fmt.Errorf("%w: node %s was removed from the cluster", membership.ErrNodeRemoved, id)
		}
		return nil
	}
}

// dialNode dials node id at address over mutual TLS.
func (t *trust) dialNode(ctx context.Context, id, address string) (net.Conn, error) {
	d := &tls.Dialer{
		NetDialer: &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 5 * time.Second},
		Config:    pki.ClientConfig(t.kp, t.verifier, t.acceptNode(id)),
	}
	t.dials.Add(1)
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("dialling node %s at %s over TLS: %w", id, address, err)
	}
	nc := &nodeConn{Conn: c, t: t, id: id}
	t.mu.Lock()
	if t.conns[id] == nil {
		t.conns[id] = map[*nodeConn]struct{}{}
	}
	t.conns[id][nc] = struct{}{}
	t.mu.Unlock()
	return nc, nil
}

// nodeConn is a TLS connection to a node, tracked so that removing the
// node cuts it.
type nodeConn struct {
	net.Conn
	t    *trust
	id   string
	once sync.Once
}

func (c *nodeConn) Close() error {
	c.once.Do(func() {
		c.t.mu.Lock()
		delete(c.t.conns[c.id], c)
		if len(c.t.conns[c.id]) == 0 {
			delete(c.t.conns, c.id)
		}
		c.t.mu.Unlock()
	})
	return c.Conn.Close()
}

// transport is node id's TLS transport. Requests keep their http URLs:
// the connection under them is TLS (HTTP/1.1, as the plain hop), so
// that the node API's client, the proxy and the volumes' data plane
// reach a node the same way whichever it serves.
func (t *trust) transport(id string) *http.Transport {
	t.mu.Lock()
	defer t.mu.Unlock()
	tr := t.transports[id]
	if tr == nil {
		tr = &http.Transport{
			DialContext: func(ctx context.Context, _, address string) (net.Conn, error) {
				return t.dialNode(ctx, id, address)
			},
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     time.Minute,
			DisableCompression:  true,
		}
		t.transports[id] = tr
	}
	return tr
}

// forget cuts a removed node's connections: its certificate, accepted
// when they were made, is not any more.
func (t *trust) forget(id string) {
	t.mu.Lock()
	tr := t.transports[id]
	delete(t.transports, id)
	conns := t.conns[id]
	delete(t.conns, id)
	t.mu.Unlock()
	if tr != nil {
		tr.CloseIdleConnections()
	}
	for c := range conns {
		c.Conn.Close()
	}
	t.log.Info("node removed: its certificate is refused from now on", "node_id", id)
}

// roundTripper reaches node id as it registered: over mutual TLS if it
// has a certificate, else in plain HTTP with the cluster token. It
// decides at each request, so that a node that restarts with a
// certificate is reached over TLS from then on.
func (t *trust) roundTripper(id string) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if t.nodes.tls(r.Context(), id) {
			r = r.Clone(r.Context())
			r.Header.Del(nodeapi.TokenHeader)
			return t.transport(id).RoundTrip(r)
		}
		if err := t.checkPlain(id, r.URL.Host); err != nil {
			return nil, err
		}
		return t.legacy.RoundTrip(r)
	})
}

// checkPlain refuses to reach node id at address in plain HTTP, with the
// cluster token, across the network (membership.CheckPlain).
func (t *trust) checkPlain(id, address string) error {
	what := "reaching node " + id
	if id == "" {
		what = "reaching a node"
	}
	return membership.CheckPlain(what, address, "join the node over https ('aenv cluster join-command')", t.insecure)
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// viaDialer is how the proxy reaches the node a sandbox runs on: over
// mutual TLS to a node with a certificate, without the cluster token;
// else in plain TCP, with it.
type viaDialer struct {
	t     *trust
	token http.Header
}

func (v viaDialer) DialVia(ctx context.Context, address string) (net.Conn, error) {
	n, ok := v.t.nodes.at(address)
	if ok && n.TLS {
		return v.t.dialNode(ctx, n.ID, address)
	}
	if err := v.t.checkPlain(n.ID, address); err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}
	return d.DialContext(ctx, "tcp", address)
}

func (v viaDialer) ViaHeader(address string) http.Header {
	if n, ok := v.t.nodes.at(address); ok && n.TLS {
		return nil
	}
	return v.token
}
