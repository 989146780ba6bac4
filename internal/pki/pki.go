// Package pki is the cluster's certificate authority: the CA that the
// first server creates (ECDSA P-256, crypto/x509 only), the short-lived
// certificates it issues to servers and nodes, what those certificates
// say about their holder (Identity), their verification against the CA,
// the CA hash a joining host pins (kubeadm's form), and the keypair a
// running process reloads when its certificate is renewed. It knows
// nothing of the cluster's state: servers (package server) and node
// agents (package agent) store and exchange what it makes. Anyone may
// import it; it imports only the standard library.
//
// A certificate names its holder for etcd RBAC too (issue 18, item 2):
// the Subject CommonName is the user name etcd's client-certificate auth
// takes, "node:<id>" for a node and "server:<name>" for a server, and the
// Organization is the role, "aenv:nodes" or "aenv:servers" (the shape of
// Kubernetes' "system:node:<name>" in "system:nodes"). The node ids a
// certificate may serve are URI SANs "aenv:node:<id>": a node's own, and
// for a server with a local node, that node's, so that one certificate on
// the server's cluster listener is both.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Roles a certificate holder has (its Subject Organization).
const (
	RoleServer = "aenv:servers"
	RoleNode   = "aenv:nodes"
	// RoleAPI is an API listener's certificate, which clients check: it
	// authenticates nothing to the cluster's members (they accept
	// servers and nodes only), so its key leaking from a front end gives
	// no way into the cluster.
	RoleAPI = "aenv:api"
)

// DefaultLifetime is how long issued certificates are valid unless told
// otherwise: short enough that a stolen one soon stops working, long
// enough that a host that was off for a weekend still renews itself.
const DefaultLifetime = 7 * 24 * time.Hour

// caLifetime is the CA's own validity. Rotating the CA is not built yet;
// ten years keeps that a decision for later rather than an outage.
const caLifetime = 10 * 365 * 24 * time.Hour

// clockSkew backdates certificates so that a host whose clock is a little
// behind the issuer's accepts them at once.
const clockSkew = time.Minute

// ErrUntrusted: a certificate is not from the cluster's CA, has expired,
// or does not name what it must.
var ErrUntrusted = errors.New("untrusted certificate")

// CA is the cluster's certificate authority. Its methods are safe for
// concurrent use (it is never modified).
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	pool    *x509.CertPool
}

// NewCA makes a new certificate authority.
func NewCA(now time.Time) (*CA, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "aenv cluster CA", Organization: []string{"aenv"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caLifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("creating the CA certificate: %w", err)
	}
	return caFrom(der, key)
}

// ParseCA reads a CA from its certificate and key in PEM.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCertificate(certPEM)
	if err != nil {
		return nil, fmt.Errorf("reading the CA certificate: %w", err)
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("reading the CA key: %w", err)
	}
	if !cert.IsCA || !key.PublicKey.Equal(cert.PublicKey) {
		return nil, errors.New("reading the CA: the key is not the certificate's, or the certificate is not a CA's")
	}
	return caFrom(cert.Raw, key)
}

func caFrom(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pool: pool}, nil
}

// Certificate is the CA's certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// CertPEM is the CA's certificate in PEM, what every member trusts.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// KeyPEM is the CA's private key in PEM: only servers hold it.
func (ca *CA) KeyPEM() []byte { return keyPEM(ca.key) }

// Hash is the CA's hash as a joining host pins it (Hash of its
// certificate).
func (ca *CA) Hash() string { return Hash(ca.cert) }

// Verifier is the CA's public side, all that verifying needs.
func (ca *CA) Verifier() *Verifier { return &Verifier{ca: ca.cert, pool: ca.pool} }

// Hash is kubeadm's CA hash of cert: "sha256:" and the hex SHA-256 of its
// DER SubjectPublicKeyInfo. It names the key, so a CA certificate
// re-signed with the same key keeps its hash.
func Hash(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Identity is who a certificate says its holder is.
type Identity struct {
	// Role is RoleServer, RoleNode or RoleAPI.
	Role string
	// Name is the server's name or the node's id (the CommonName without
	// its "server:"/"node:" prefix).
	Name string
	// Nodes are the node ids the holder serves (URI SANs): a node's own
	// id; a server's local node.
	Nodes []string
}

// CommonName is id's Subject CommonName, the user name etcd would see.
func (id Identity) CommonName() string {
	switch id.Role {
	case RoleServer:
		return "server:" + id.Name
	case RoleAPI:
		return "api:" + id.Name
	}
	return "node:" + id.Name
}

// Serves reports whether the holder may answer as node nodeID.
func (id Identity) Serves(nodeID string) bool { return slices.Contains(id.Nodes, nodeID) }

// Request is what a certificate is issued for.
type Request struct {
	Identity
	// Hosts are the DNS names and IP addresses the holder serves TLS at
	// (informational: members check identities, not host names, as they
	// reach each other by registered addresses that NAT may rewrite).
	Hosts []string
	// Lifetime is how long the certificate is valid (0: DefaultLifetime).
	Lifetime time.Duration
}

// Issue signs a certificate of r for pub, valid from now. A node's
// request names exactly its own id.
func (ca *CA) Issue(pub crypto.PublicKey, r Request, now time.Time) ([]byte, error) {
	switch {
	case r.Role != RoleServer && r.Role != RoleNode && r.Role != RoleAPI:
		return nil, fmt.Errorf("issuing a certificate: unknown role %q", r.Role)
	case r.Name == "":
		return nil, errors.New("issuing a certificate: no name")
	case r.Role == RoleNode && (len(r.Nodes) != 1 || r.Nodes[0] != r.Name):
		return nil, fmt.Errorf("issuing a certificate for node %s: it may serve only its own id", r.Name)
	case r.Role == RoleAPI && len(r.Nodes) > 0:
		return nil, fmt.Errorf("issuing an API certificate for %s: it may serve no node", r.Name)
	}
	life := r.Lifetime
	if life <= 0 {
		life = DefaultLifetime
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: r.CommonName(), Organization: []string{r.Role}},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(life),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Both: servers serve and dial nodes; nodes serve and renew.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if r.Role == RoleAPI {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	}
	for _, n := range r.Nodes {
		tmpl.URIs = append(tmpl.URIs, &url.URL{Scheme: "aenv", Opaque: "node:" + url.PathEscape(n)})
	}
	for _, h := range r.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("issuing a certificate for %s: %w", r.CommonName(), err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// IssueCSR is Issue for the key of a PEM certificate request, whose
// signature proves its sender holds that key. What the request asks for
// is ignored: the issuer alone decides the identity.
func (ca *CA) IssueCSR(csrPEM []byte, r Request, now time.Time) ([]byte, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("reading a certificate request: not a PEM CERTIFICATE REQUEST")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("reading a certificate request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("reading a certificate request: %w", err)
	}
	return ca.Issue(csr.PublicKey, r, now)
}

// IdentityOf is what cert says of its holder.
func IdentityOf(cert *x509.Certificate) Identity {
	var id Identity
	if len(cert.Subject.Organization) == 1 {
		id.Role = cert.Subject.Organization[0]
	}
	cn := cert.Subject.CommonName
	switch id.Role {
	case RoleServer:
		id.Name, _ = strings.CutPrefix(cn, "server:")
	case RoleNode:
		id.Name, _ = strings.CutPrefix(cn, "node:")
	case RoleAPI:
		id.Name, _ = strings.CutPrefix(cn, "api:")
	}
	for _, u := range cert.URIs {
		if n, ok := strings.CutPrefix(u.Opaque, "node:"); ok && u.Scheme == "aenv" {
			if n, err := url.PathUnescape(n); err == nil {
				id.Nodes = append(id.Nodes, n)
			}
		}
	}
	return id
}

// Verifier checks certificates against the cluster's CA. It is safe for
// concurrent use.
type Verifier struct {
	ca   *x509.Certificate
	pool *x509.CertPool
}

// NewVerifier trusts the CA certificate in caPEM.
func NewVerifier(caPEM []byte) (*Verifier, error) {
	cert, err := ParseCertificate(caPEM)
	if err != nil {
		return nil, fmt.Errorf("reading the CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("reading the CA certificate: it is not a CA's")
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &Verifier{ca: cert, pool: pool}, nil
}

// Hash is the CA's hash.
func (v *Verifier) Hash() string { return Hash(v.ca) }

// CertPEM is the CA certificate in PEM.
func (v *Verifier) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: v.ca.Raw})
}

// Verify checks the chain a peer presented (leaf first, DER, as
// tls.ConnectionState.PeerCertificates holds it) at now: the leaf is
// signed by the CA and valid. It returns the leaf and what it says.
func (v *Verifier) Verify(chain []*x509.Certificate, now time.Time) (*x509.Certificate, Identity, error) {
	if len(chain) == 0 {
		return nil, Identity{}, fmt.Errorf("%w: no certificate", ErrUntrusted)
	}
	leaf := chain[0]
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:       v.pool,
		CurrentTime: now,
		KeyUsages:   []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return nil, Identity{}, fmt.Errorf("%w: %s: %v", ErrUntrusted, leaf.Subject.CommonName, err)
	}
	return leaf, IdentityOf(leaf), nil
}

// PinnedVerifier finds, in a chain a server presented, the CA certificate
// whose Hash is hash, and returns a Verifier trusting it: how a joining
// host that holds only the hash learns the CA. The chain's leaf must
// still verify against it.
func PinnedVerifier(chain []*x509.Certificate, hash string, now time.Time) (*Verifier, *x509.Certificate, Identity, error) {
	for _, c := range chain {
		if c.IsCA && Hash(c) == strings.ToLower(strings.TrimSpace(hash)) {
			pool := x509.NewCertPool()
			pool.AddCert(c)
			v := &Verifier{ca: c, pool: pool}
			leaf, id, err := v.Verify(chain, now)
			return v, leaf, id, err
		}
	}
	return nil, nil, Identity{}, fmt.Errorf("%w: the server's certificate chain holds no CA of hash %s (is --ca-hash this cluster's? `aenv cluster join-command` prints it)", ErrUntrusted, hash)
}

// RenewAt is when a holder renews cert: at two thirds of its life (from
// its issue, not its backdated start), so that a renewal that fails has
// a third of it left to be retried.
func RenewAt(cert *x509.Certificate) time.Time {
	issued := IssuedAt(cert)
	return issued.Add(cert.NotAfter.Sub(issued) * 2 / 3)
}

// IssuedAt is when cert was issued (its NotBefore is backdated).
func IssuedAt(cert *x509.Certificate) time.Time { return cert.NotBefore.Add(clockSkew) }

// NewKey makes a private key (ECDSA P-256).
func NewKey() (*ecdsa.PrivateKey, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating a key: %w", err)
	}
	return k, nil
}

// NewCSR is a PEM certificate request for key: it proves the holder of
// key asked. The subject is left to the issuer.
func NewCSR(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, fmt.Errorf("making a certificate request: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), nil
}

// ParseCertificate reads the first certificate in PEM.
func ParseCertificate(b []byte) (*x509.Certificate, error) {
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return nil, errors.New("no PEM CERTIFICATE")
		}
		if blk.Type == "CERTIFICATE" {
			return x509.ParseCertificate(blk.Bytes)
		}
	}
}

// ParseKey reads an ECDSA private key in PEM (SEC 1 or PKCS #8).
func ParseKey(b []byte) (*ecdsa.PrivateKey, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("no PEM key")
	}
	if k, err := x509.ParseECPrivateKey(blk.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil, err
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok {
		return nil, errors.New("not an ECDSA key")
	}
	return ek, nil
}

// KeyPEM is key in PEM (SEC 1).
func KeyPEM(key *ecdsa.PrivateKey) []byte { return keyPEM(key) }

func keyPEM(key *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		panic(err) // a P-256 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
