package server

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"slices"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/pki"
)

// apiTLS is how the API listener at listen serves, for sandbox hosts
// under domain: nil for plain HTTP (on loopback, or beyond it with
// InsecureHTTP), else the operator's certificate (TLSCert, TLSKey) or,
// without one, a certificate of the cluster's CA for the listener's
// names and the sandbox hosts (*.<domain>), renewed in place.
func (s *Server) apiTLS(listen net.Addr, domain string) (*tls.Config, error) {
	cfg := s.cfg
	switch {
	case (cfg.TLSCert == "") != (cfg.TLSKey == ""):
		return nil, fmt.Errorf("serving the API: give both --tls-cert and --tls-key, or neither")
	case cfg.TLSCert != "":
		// Loaded now, so that a wrong file fails the start, not the
		// first client.
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("serving the API: loading --tls-cert and --tls-key: %w", err)
		}
		return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
	case !cfg.HTTPS && membership.IsLocal(listen.String()):
		return nil, nil
	case !cfg.HTTPS && cfg.InsecureHTTP:
		s.log.Warn("--insecure-http: the API serves plain HTTP beyond loopback, so API keys, envd tokens and sandboxes' traffic cross the network in the clear", "listen", listen.String())
		return nil, nil
	}
	hostname, _ := os.Hostname()
	req := pki.Request{
		Identity: pki.Identity{Role: pki.RoleAPI, Name: hostname + ":" + cfg.DataDir},
		Hosts:    apiHosts(listen, domain, cfg.Advertise, hostname),
		Lifetime: cfg.Trust.CertLifetime,
	}
	kp, err := s.trust.issue(req)
	if err != nil {
		return nil, fmt.Errorf("serving the API: a certificate of the cluster's CA: %w", err)
	}
	s.trust.keep(req, kp)
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: kp.GetCertificate}, nil
}

// apiHosts are the names an API certificate of the cluster's CA is for:
// the domain and its sandbox hosts, the host's names and the addresses it
// listens at (all of the host's addresses when it listens on every one).
func apiHosts(listen net.Addr, domain, advertise, hostname string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	add := func(h string) {
		if h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	if d := membership.HostOf(domain); d != "" {
		add(d)
		add("*." + d)
	}
	add(hostname)
	add(membership.HostOf(advertise))
	ip := listenIP(listen)
	if ip != nil && !ip.IsUnspecified() {
		add(ip.String())
	} else if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				add(n.IP.String())
			}
		}
	}
	return hosts
}

func listenIP(a net.Addr) net.IP {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP
	}
	return nil
}
