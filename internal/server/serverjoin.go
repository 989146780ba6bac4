package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/sealed"
)

// A second API server joins the cluster as kubeadm's control plane does:
// it checks the cluster listener's certificate against the CA hash it
// was given, then trades a join token of the server role for what every
// server holds: the etcd endpoints, the data key, the cluster token and
// the CA with its key (every server signs certificates; with the CA it
// issues its own, its etcd client certificate among them). It writes
// them to its data directory, where a server started by hand would have
// them copied, and starts as any server does. A node's join token is
// refused here, so the tokens handed out most never yield the CA's key.

// joinedFile records a server's join (joinedRecord) under its data
// directory, so that a restart needs no token: the secrets it was handed
// are in <data-dir>/secrets.
func joinedFile(dataDir string) string { return filepath.Join(dataDir, "joined.json") }

type joinedRecord struct {
	URL           string   `json:"url"`
	CAHash        string   `json:"caHash"`
	EtcdEndpoints []string `json:"etcdEndpoints"`
}

// serverJoin trades a join token of the server role for a
// ServerJoinAnswer.
func (s *Server) serverJoin(w http.ResponseWriter, r *http.Request) {
	s.trust.joins.Add(1)
	var req membership.ServerJoinRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<10)).Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, "reading the join request: "+err.Error())
		return
	}
	rec, err := membership.CheckJoinToken(r.Context(), s.state, req.Token, membership.JoinServer, time.Now())
	switch {
	case errors.Is(err, membership.ErrJoinTokenRole):
		s.log.Warn("refused a server's join with a node's join token", "remote", r.RemoteAddr, "err", err)
		writeJSONError(w, http.StatusForbidden, "this join token joins a node, not an API server: make a server's with 'aenv cluster join-command --server'")
		return
	case errors.Is(err, membership.ErrInvalidJoinToken):
		s.log.Warn("refused a server's join", "remote", r.RemoteAddr, "err", err)
		writeJSONError(w, http.StatusUnauthorized, "invalid, expired or revoked join token")
		return
	case err != nil:
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	if s.cfg.EtcdCertFile != "" || s.cfg.EtcdKeyFile != "" || s.cfg.EtcdCAFile != "" {
		writeJSONError(w, http.StatusConflict, "this server reaches etcd with certificates of the operator's own (--etcd-cert, --etcd-key, --etcd-ca), which a join cannot hand over: start the new server with the same --etcd-endpoints and files, and copy <data-dir>/secrets (data-key, cluster-token, ca.crt, ca.key) from this one")
		return
	}
	eps, err := s.nodeEtcdEndpoints()
	if err != nil {
		writeJSONError(w, http.StatusConflict, err.Error())
		return
	}
	s.log.Info("an API server is joining with a join token: it is handed the CA and the data key", "token_id", rec.ID, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(membership.ServerJoinAnswer{
		EtcdEndpoints: eps, DataKey: s.dataKeyText(), ClusterToken: s.token,
		CA: string(s.trust.ca.CertPEM()), CAKey: string(s.trust.ca.KeyPEM()),
	})
}

// joinAsServer is the start of a server given --join: the secrets of the
// cluster written to its data directory (from a join, or from an earlier
// one), and the cluster's etcd endpoints put in cfg.
func joinAsServer(ctx context.Context, cfg *Config, log *slog.Logger) error {
	fail := func(err error) error { return fmt.Errorf("joining the cluster at %s as a server: %w", cfg.Join, err) }
	if !strings.HasPrefix(cfg.Join, "https://") {
		return fail(errors.New("--join must be a server's cluster listener, https://SERVER:8443 ('aenv cluster join-command --server' prints the command)"))
	}
	if len(cfg.EtcdClientURLs) > 0 {
		return fail(errors.New("a joined server uses the cluster's etcd: --etcd-listen does not go with --join"))
	}
	files := membership.CAFiles(cfg.DataDir)
	local, err := membership.ReadCAFiles(files)
	if err != nil {
		return fail(err)
	}
	if local != nil && cfg.CAHash != "" && !strings.EqualFold(local.Hash(), cfg.CAHash) {
		return fail(fmt.Errorf("%s holds CA %s, not --ca-hash %s (this data directory is another cluster's)", files.CAPath(), local.Hash(), cfg.CAHash))
	}
	if b, err := os.ReadFile(joinedFile(cfg.DataDir)); err == nil && local != nil {
		// Joined before: what it was handed is in the data directory.
		var rec joinedRecord
		if err := json.Unmarshal(b, &rec); err != nil || len(rec.EtcdEndpoints) == 0 {
			return fail(fmt.Errorf("reading %s: %v", joinedFile(cfg.DataDir), err))
		}
		if len(cfg.EtcdEndpoints) == 0 {
			cfg.EtcdEndpoints = rec.EtcdEndpoints
		}
		log.Info("this server joined the cluster before; starting with what it was handed", "ca_hash", local.Hash(), "etcd", cfg.EtcdEndpoints)
		return nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fail(err)
	}
	token := cfg.JoinToken
	if token == "" {
		token = os.Getenv(agent.JoinTokenEnv)
	}
	if token == "" {
		return fail(fmt.Errorf("give --token-file (a join token of the server role: 'aenv cluster join-command --server' prints the command) or $%s", agent.JoinTokenEnv))
	}
	if cfg.CAHash == "" {
		return fail(errors.New("give --ca-hash sha256:... ('aenv cluster join-command --server' prints it): without it the server cannot be told from an impostor, and it is handed the CA's key"))
	}
	var pinned *pki.Verifier
	ans, err := postServerJoin(ctx, cfg.Join, pki.PinnedConfig(cfg.CAHash, pki.RoleServer, func(v *pki.Verifier) { pinned = v }), token)
	if err != nil {
		return fail(err)
	}
	if len(ans.EtcdEndpoints) == 0 {
		return fail(errors.New("the answer names no etcd endpoints"))
	}
	if _, err := sealed.ParseKeys(ans.DataKey); err != nil {
		return fail(fmt.Errorf("the data key handed over: %w", err))
	}
	if len(ans.ClusterToken) < 16 {
		return fail(errors.New("the answer holds no cluster token"))
	}
	ca, err := pki.ParseCA([]byte(ans.CA), []byte(ans.CAKey))
	if err != nil || pinned == nil || ca.Hash() != pinned.Hash() {
		return fail(fmt.Errorf("the CA handed over is not the one the server's certificate was verified with (%v)", err))
	}
	// The secrets go where a server keeps them, unless the operator gave
	// their own, which the start checks against the cluster's.
	var writes []func() error
	if os.Getenv(membership.DataKeyEnv) == "" && cfg.DataKeyFile == "" {
		w, err := secretWrite(membership.DataKeyPath(cfg.DataDir), ans.DataKey, sameKeys)
		if err != nil {
			return fail(err)
		}
		writes = append(writes, w)
	}
	if cfg.ClusterToken == "" && os.Getenv(membership.ClusterTokenEnv) == "" {
		w, err := secretWrite(membership.ClusterTokenPath(cfg.DataDir), ans.ClusterToken, sameText)
		if err != nil {
			return fail(err)
		}
		writes = append(writes, w)
	}
	for _, w := range writes {
		if err := w(); err != nil {
			return fail(err)
		}
	}
	if _, err := membership.StoreCAFiles(files, []byte(ans.CA), []byte(ans.CAKey)); err != nil {
		return fail(err)
	}
	rec, _ := json.Marshal(joinedRecord{URL: cfg.Join, CAHash: ca.Hash(), EtcdEndpoints: ans.EtcdEndpoints})
	if err := pki.WriteSecret(joinedFile(cfg.DataDir), rec); err != nil {
		return fail(err)
	}
	if len(cfg.EtcdEndpoints) == 0 {
		cfg.EtcdEndpoints = ans.EtcdEndpoints
	}
	log.Info("joined the cluster as a server: its CA, data key and cluster token are in the data directory", "ca_hash", ca.Hash(), "etcd", cfg.EtcdEndpoints)
	return nil
}

// secretWrite checks that the secret file at path is missing or holds
// value already (same), and returns the write that stores value there:
// a join never overwrites a secret of the data directory's, which may be
// another cluster's and the only copy.
func secretWrite(path, value string, same func(a, b string) bool) (func() error, error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil && same(string(b), value):
		return func() error { return nil }, nil
	case err == nil:
		return nil, fmt.Errorf("%s holds another secret than the cluster's: remove it (this data directory was another cluster's), or join with a fresh --data-dir", path)
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	return func() error { return membership.StoreSecret(path, strings.TrimSpace(value)) }, nil
}

func sameText(a, b string) bool { return strings.TrimSpace(a) == strings.TrimSpace(b) }

func sameKeys(a, b string) bool {
	ka, errA := sealed.ParseKeys(a)
	kb, errB := sealed.ParseKeys(b)
	return errA == nil && errB == nil && sealed.FormatKeys(ka) == sealed.FormatKeys(kb)
}

// postServerJoin sends the join token to url's ServerJoinPath over a
// connection of tcfg (which checks the server before anything is sent).
func postServerJoin(ctx context.Context, url string, tcfg *tls.Config, token string) (membership.ServerJoinAnswer, error) {
	var ans membership.ServerJoinAnswer
	body, _ := json.Marshal(membership.ServerJoinRequest{Token: token})
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(url, "/")+membership.ServerJoinPath, bytes.NewReader(body))
	if err != nil {
		return ans, err
	}
	req.Header.Set("Content-Type", "application/json")
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tcfg, DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return ans, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		var e struct{ Message string }
		_ = json.Unmarshal(b, &e)
		return ans, fmt.Errorf("the server refused (%d): %s", resp.StatusCode, e.Message)
	}
	if err := json.Unmarshal(b, &ans); err != nil {
		return ans, fmt.Errorf("reading the answer: %w", err)
	}
	return ans, nil
}
