package pki

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"time"
)

// Accept decides, once a peer's chain has verified against the CA,
// whether this peer is the one wanted (its role, the node id it serves,
// whether it was removed).
type Accept func(leaf *x509.Certificate, id Identity) error

// ServerConfig is the TLS config of a member's listener: it presents kp's
// current certificate and verifies a client's against v, then accept.
// With require, a client without a certificate is refused in the
// handshake; without, it may come in (a joining node, which has none),
// and handlers check r.TLS for what they need.
func ServerConfig(kp *Keypair, v *Verifier, require bool, accept Accept) *tls.Config {
	auth := tls.RequestClientCert
	if require {
		auth = tls.RequireAnyClientCert
	}
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: kp.GetCertificate,
		// The chain is verified against the CA below, not by the
		// system's roots: ClientCAs would do it too, but VerifyConnection
		// sees resumed sessions as well, so the removal check holds there.
		ClientAuth: auth,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return nil // only without require
			}
			leaf, id, err := v.Verify(cs.PeerCertificates, time.Now())
			if err != nil {
				return err
			}
			if accept != nil {
				return accept(leaf, id)
			}
			return nil
		},
	}
}

// ClientConfig is the TLS config a member dials another with: it presents
// kp's current certificate (nil: none, a joining node) and verifies the
// peer's chain against v, then accept. Host names are not checked:
// members reach each other at registered addresses, and what proves a
// peer is the identity its certificate names, which accept checks.
func ClientConfig(kp *Keypair, v *Verifier, accept Accept) *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Verified by VerifyConnection against the cluster's CA.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			leaf, id, err := v.Verify(cs.PeerCertificates, time.Now())
			if err != nil {
				return err
			}
			if accept != nil {
				return accept(leaf, id)
			}
			return nil
		},
		// Resumed sessions skip the key exchange's signatures: most of a
		// handshake's cost for the proxy's many short connections.
		ClientSessionCache: tls.NewLRUClientSessionCache(256),
	}
	if kp != nil {
		cfg.GetClientCertificate = kp.GetClientCertificate
	}
	return cfg
}

// WantRole is an Accept that wants role.
func WantRole(role string) Accept {
	return func(_ *x509.Certificate, id Identity) error {
		if id.Role != role {
			return fmt.Errorf("%w: %s has role %q, want %q", ErrUntrusted, id.CommonName(), id.Role, role)
		}
		return nil
	}
}

// PinnedConfig is the TLS config of a join: the peer must present a
// certificate of role whose chain holds the CA of hash, and verifies
// against it (PinnedVerifier), before anything is sent; learned is told
// the CA found, which the joining host trusts from then on. No
// certificate is presented (the joining host has none yet).
func PinnedConfig(hash, role string, learned func(*Verifier)) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Verified below against the pinned CA hash, not a host name.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			v, _, id, err := PinnedVerifier(cs.PeerCertificates, hash, time.Now())
			if err != nil {
				return err
			}
			if id.Role != role {
				return fmt.Errorf("%w: %s's certificate is not of role %s", ErrUntrusted, id.CommonName(), role)
			}
			learned(v)
			return nil
		},
	}
}
