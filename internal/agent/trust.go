package agent

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/pki"
)

// JoinTokenEnv carries the join token when --token does not.
const JoinTokenEnv = "AENV_JOIN_TOKEN"

// TLSNodeHandler serves NodeHandler's routes over mutual TLS, to the
// cluster's servers only: callers whose certificate (verified against the
// CA by the listener's TLS config) has the server role. The cluster
// token is neither needed nor passed on.
func (h *Host) TLSNodeHandler(log *slog.Logger) http.Handler {
	return RequireServerCert(log, h.nodeHandler(log))
}

// RequireServerCert serves h only to requests over TLS that presented a
// certificate of the server role. The listener's TLS config must have
// verified the chain against the cluster's CA (pki.ServerConfig).
func RequireServerCert(log *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || pki.IdentityOf(r.TLS.PeerCertificates[0]).Role != pki.RoleServer {
			log.Warn("refused a request without a server's certificate", "remote", r.RemoteAddr, "path", r.URL.Path)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]any{"code": http.StatusForbidden, "message": "this needs a server's certificate of the cluster"})
			return
		}
		r.Header.Del(nodeapi.TokenHeader)
		h.ServeHTTP(w, r)
	})
}

// nodeCreds are a node's certificate, key and the cluster's CA, kept in
// <data-dir>/secrets/node.{crt,key} and ca.crt (mode 0600), and renewed
// in the background at two thirds of the certificate's life at the
// server it joined, over mutual TLS with the current certificate.
type nodeCreds struct {
	files    pki.Files
	kp       *pki.Keypair
	verifier *pki.Verifier
	join     string
	nodeID   string
	instance string
	log      *slog.Logger
	cancel   context.CancelFunc
	done     chan struct{}
}

// NodeFiles are where a node that joined over https keeps its
// certificate and key: <data-dir>/secrets/node.crt and node.key, beside
// the cluster's ca.crt.
func NodeFiles(dataDir string) pki.Files {
	return pki.Files{Dir: membership.SecretsDir(dataDir), Name: "node"}
}

// joinTLS is a node's join at an https server URL: with a certificate
// from an earlier join that is still good, a renewal (the server tells it
// the cluster as a join would); otherwise the join token and a
// certificate request, sent only once the server's certificate chain has
// verified against the CA hash.
func joinTLS(ctx context.Context, cfg Config, instance string, log *slog.Logger) (membership.JoinAnswer, *nodeCreds, error) {
	c := &nodeCreds{files: NodeFiles(cfg.DataDir),
		join: strings.TrimRight(cfg.Join, "/"), nodeID: cfg.NodeID, instance: instance, log: log}
	token := cfg.ClusterToken
	if token == "" {
		token = os.Getenv(JoinTokenEnv)
	}
	certPEM, key, caPEM, err := c.files.Load()
	switch {
	case err == nil:
		if c.verifier, err = pki.NewVerifier(caPEM); err != nil {
			return membership.JoinAnswer{}, nil, fmt.Errorf("joining %s: %s: %w", cfg.Join, c.files.CAPath(), err)
		}
		if cfg.CAHash != "" && !strings.EqualFold(cfg.CAHash, c.verifier.Hash()) {
			return membership.JoinAnswer{}, nil, fmt.Errorf("joining %s: %s is CA %s, not --ca-hash %s (remove %s to join another cluster)",
				cfg.Join, c.files.CAPath(), c.verifier.Hash(), cfg.CAHash, c.files.Dir)
		}
		if c.kp, err = pki.NewKeypair(certPEM, key, caPEM); err != nil {
			return membership.JoinAnswer{}, nil, fmt.Errorf("joining %s: %s: %w", cfg.Join, c.files.CertPath(), err)
		}
		id := pki.IdentityOf(c.kp.Leaf())
		if id.Role == pki.RoleNode && id.Name == cfg.NodeID && time.Now().Before(c.kp.Leaf().NotAfter) {
			ans, err := c.renew(ctx)
			if err == nil {
				return ans, c, nil
			}
			if token == "" {
				return membership.JoinAnswer{}, nil, err
			}
			log.Warn("this node's certificate was not renewed; joining with the join token", "node_id", cfg.NodeID, "err", err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return membership.JoinAnswer{}, nil, fmt.Errorf("joining %s: reading this node's certificate: %w", cfg.Join, err)
	}
	if token == "" {
		return membership.JoinAnswer{}, nil, fmt.Errorf("joining %s: give --token (a join token: `aenv cluster join-command` on a server prints the whole command) or $%s", cfg.Join, JoinTokenEnv)
	}
	if cfg.CAHash == "" {
		return membership.JoinAnswer{}, nil, fmt.Errorf("joining %s: give --ca-hash sha256:... (`aenv cluster join-command` prints it): without it the server cannot be told from an impostor", cfg.Join)
	}
	ans, err := c.tokenJoin(ctx, token, cfg.CAHash)
	return ans, c, err
}

// tokenJoin trades the join token and a certificate request for the
// node's certificate, over TLS to a server whose chain holds the CA of
// hash (nothing is sent before that is checked).
func (c *nodeCreds) tokenJoin(ctx context.Context, token, hash string) (membership.JoinAnswer, error) {
	tcfg := pki.PinnedConfig(hash, pki.RoleServer, func(v *pki.Verifier) { c.verifier = v })
	return c.exchange(ctx, tcfg, membership.TLSJoinPath, membership.JoinRequest{Token: token, NodeID: c.nodeID, Instance: c.instance})
}

// renew trades the current certificate for a new one.
func (c *nodeCreds) renew(ctx context.Context) (membership.JoinAnswer, error) {
	tcfg := pki.ClientConfig(c.kp, c.verifier, pki.WantRole(pki.RoleServer))
	tcfg.ClientSessionCache = nil
	return c.exchange(ctx, tcfg, membership.RenewPath, membership.JoinRequest{})
}

// exchange sends req with a certificate request for a new key to path,
// and takes the certificate the answer carries (storing it, and making
// it the one served from then on).
func (c *nodeCreds) exchange(ctx context.Context, tcfg *tls.Config, path string, req membership.JoinRequest) (membership.JoinAnswer, error) {
	var ans membership.JoinAnswer
	fail := func(err error) (membership.JoinAnswer, error) {
		return membership.JoinAnswer{}, fmt.Errorf("joining %s (%s) as node %s: %w", c.join, path, c.nodeID, err)
	}
	key, err := pki.NewKey()
	if err != nil {
		return fail(err)
	}
	csr, err := pki.NewCSR(key)
	if err != nil {
		return fail(err)
	}
	req.CSR = string(csr)
	body, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.join+path, bytes.NewReader(body))
	if err != nil {
		return fail(err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	// A connection of its own: the certificate presented is the one of
	// this moment, and nothing is pooled past it.
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tcfg, DisableKeepAlives: true, ForceAttemptHTTP2: false}}
	resp, err := hc.Do(hreq)
	if err != nil {
		return fail(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var e struct{ Message string }
		_ = json.Unmarshal(b, &e)
		return fail(fmt.Errorf("the server refused (%d): %s", resp.StatusCode, e.Message))
	}
	if err := json.Unmarshal(b, &ans); err != nil || len(ans.EtcdEndpoints) == 0 {
		return fail(fmt.Errorf("no etcd endpoints in the answer (%v)", err))
	}
	ca, err := pki.NewVerifier([]byte(ans.CA))
	if err != nil || ca.Hash() != c.verifier.Hash() {
		return fail(fmt.Errorf("the answer's CA is not the one the server's certificate was verified with (%v)", err))
	}
	leaf, err := pki.ParseCertificate([]byte(ans.Certificate))
	if err != nil {
		return fail(fmt.Errorf("the certificate handed over: %w", err))
	}
	if _, id, err := c.verifier.Verify([]*x509.Certificate{leaf}, time.Now()); err != nil || id.Role != pki.RoleNode || !id.Serves(c.nodeID) {
		return fail(fmt.Errorf("the certificate handed over is not node %s's of the cluster: %+v %v", c.nodeID, id, err))
	}
	if c.kp == nil {
		c.kp, err = pki.NewKeypair([]byte(ans.Certificate), key, []byte(ans.CA))
	} else {
		err = c.kp.Set([]byte(ans.Certificate), key, []byte(ans.CA))
	}
	if err != nil {
		return fail(err)
	}
	if err := c.files.Store([]byte(ans.Certificate), key, []byte(ans.CA)); err != nil {
		return fail(err)
	}
	return ans, nil
}

// serverConfig is the TLS config of the node's listener: its certificate,
// and servers' certificates only.
func (c *nodeCreds) serverConfig() *tls.Config {
	return pki.ServerConfig(c.kp, c.verifier, true, pki.WantRole(pki.RoleServer))
}

// start renews the certificate in the background until close.
func (c *nodeCreds) start() {
	bg, cancel := context.WithCancel(context.Background())
	c.cancel, c.done = cancel, make(chan struct{})
	go func() {
		defer close(c.done)
		for {
			leaf := c.kp.Leaf()
			wait := time.Until(pki.RenewAt(leaf))
			select {
			case <-bg.Done():
				return
			case <-time.After(wait):
			}
			if _, err := c.renew(bg); err != nil {
				if bg.Err() != nil {
					return
				}
				// Retried well within what is left of the certificate.
				retry := min(time.Minute, max(time.Second, time.Until(leaf.NotAfter)/10))
				c.log.Warn("renewing this node's certificate", "node_id", c.nodeID, "expires", leaf.NotAfter, "retry_in", retry, "err", err)
				select {
				case <-bg.Done():
					return
				case <-time.After(retry):
				}
				continue
			}
			c.log.Info("renewed this node's certificate", "node_id", c.nodeID, "expires", c.kp.Leaf().NotAfter)
		}
	}()
}

// close stops the renewals.
func (c *nodeCreds) close() {
	if c != nil && c.cancel != nil {
		c.cancel()
		<-c.done
	}
}

// serveTLS makes the agent's listener serve mutual TLS with its
// certificate, to servers only, and starts the certificate's renewals.
func (a *Agent) serveTLS() {
	a.http.Handler = a.host.TLSNodeHandler(a.log)
	a.http.TLSConfig = a.creds.serverConfig()
	a.http.ErrorLog = slog.NewLogLogger(a.log.Handler(), slog.LevelDebug)
	a.listener = tls.NewListener(a.listener, a.http.TLSConfig)
	a.creds.start()
}
