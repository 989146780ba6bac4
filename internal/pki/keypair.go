package pki

import (
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
)

// Keypair is a process's current certificate and key, swapped in place
// when the certificate is renewed: TLS configs read it on every
// handshake (GetCertificate, GetClientCertificate), so a renewal needs no
// restart and leaves open connections alone. It is safe for concurrent
// use.
type Keypair struct {
	cur atomic.Pointer[tls.Certificate]
}

// NewKeypair holds certPEM (with the CA's certificate after it, so that
// peers that pin only the CA's hash can find it) and key.
func NewKeypair(certPEM []byte, key *ecdsa.PrivateKey, caPEM []byte) (*Keypair, error) {
	kp := &Keypair{}
	return kp, kp.Set(certPEM, key, caPEM)
}

// Set replaces the keypair's certificate.
func (kp *Keypair) Set(certPEM []byte, key *ecdsa.PrivateKey, caPEM []byte) error {
	leaf, err := ParseCertificate(certPEM)
	if err != nil {
		return fmt.Errorf("reading a certificate: %w", err)
	}
	if !key.PublicKey.Equal(leaf.PublicKey) {
		return errors.New("reading a certificate: it is not for this key")
	}
	c := &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
	if ca, err := ParseCertificate(caPEM); err == nil {
		c.Certificate = append(c.Certificate, ca.Raw)
	}
	kp.cur.Store(c)
	return nil
}

// Leaf is the current certificate.
func (kp *Keypair) Leaf() *x509.Certificate { return kp.cur.Load().Leaf }

// Key is the current private key.
func (kp *Keypair) Key() *ecdsa.PrivateKey { return kp.cur.Load().PrivateKey.(*ecdsa.PrivateKey) }

// GetCertificate is for tls.Config.GetCertificate.
func (kp *Keypair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return kp.cur.Load(), nil
}

// GetClientCertificate is for tls.Config.GetClientCertificate.
func (kp *Keypair) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return kp.cur.Load(), nil
}

// Files name where a host keeps its certificate, key and the CA's
// certificate (and, on a server, the CA's key).
type Files struct{ Dir, Name string }

// CertPath, KeyPath and CAPath are the files' paths.
func (f Files) CertPath() string { return filepath.Join(f.Dir, f.Name+".crt") }

// KeyPath is the private key's file (mode 0600).
func (f Files) KeyPath() string { return filepath.Join(f.Dir, f.Name+".key") }

// CAPath is the CA certificate's file.
func (f Files) CAPath() string { return filepath.Join(f.Dir, "ca.crt") }

// CAKeyPath is the CA key's file (servers only; mode 0600).
func (f Files) CAKeyPath() string { return filepath.Join(f.Dir, "ca.key") }

// Load reads the keypair and the CA certificate; os.ErrNotExist when the
// host has none yet.
func (f Files) Load() (certPEM []byte, key *ecdsa.PrivateKey, caPEM []byte, err error) {
	if certPEM, err = os.ReadFile(f.CertPath()); err != nil {
		return nil, nil, nil, err
	}
	kb, err := os.ReadFile(f.KeyPath())
	if err != nil {
		return nil, nil, nil, err
	}
	if key, err = ParseKey(kb); err != nil {
		return nil, nil, nil, fmt.Errorf("reading %s: %w", f.KeyPath(), err)
	}
	if caPEM, err = os.ReadFile(f.CAPath()); err != nil {
		return nil, nil, nil, err
	}
	return certPEM, key, caPEM, nil
}

// Store writes the keypair and the CA certificate, each file replaced
// whole (a crash leaves the old or the new one, never half), readable
// by the owner only.
func (f Files) Store(certPEM []byte, key *ecdsa.PrivateKey, caPEM []byte) error {
	if err := WriteSecret(f.KeyPath(), KeyPEM(key)); err != nil {
		return err
	}
	if err := WriteSecret(f.CertPath(), certPEM); err != nil {
		return err
	}
	return WriteSecret(f.CAPath(), caPEM)
}

// WriteSecret replaces path with b (mode 0600), through a temporary file
// and a rename.
func WriteSecret(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
