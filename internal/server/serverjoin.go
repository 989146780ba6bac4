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
	"github.com/aenvhq/aenv/internal/state"
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
	// EtcdName and EtcdInitialCluster are set for a server that runs a
	// member of the cluster's etcd: the cluster its member first starts
	// in, kept so that a start after a crash before the member had any
	// data joins that cluster again rather than making one of its own.
	EtcdName           string `json:"etcdName,omitempty"`
	EtcdInitialCluster string `json:"etcdInitialCluster,omitempty"`
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
		writeJSONError(w, http.StatusUnauthorized, "invalid, expired, revoked or used join token (a server's token joins one server)")
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
	// A server's token admits one server: whoever copied it from a
	// terminal or a shell history later gets nothing (a node's token
	// joins any number of nodes, which never see the CA's key).
	restore, err := membership.UseJoinToken(r.Context(), s.state, rec.ID)
	switch {
	case errors.Is(err, membership.ErrInvalidJoinToken):
		s.log.Warn("refused a server's join", "remote", r.RemoteAddr, "err", err)
		writeJSONError(w, http.StatusUnauthorized, "this join token was used by another server's join: a server's token joins one server; make another with 'aenv cluster join-command --server'")
		return
	case err != nil:
		writeJSONError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	// Refused after this, the join did not happen: the token is the
	// operator's to use again.
	refuse := func(code int, msg string) {
		if err := restore(context.WithoutCancel(r.Context())); err != nil {
			s.log.Warn("a refused server join could not give its token back", "token_id", rec.ID, "err", err)
		}
		writeJSONError(w, code, msg)
	}
	var initial string
	if len(req.EtcdPeerURLs) > 0 {
		if s.etcdTLS == nil {
			refuse(http.StatusConflict, "this cluster's etcd does not serve TLS with the cluster's CA, which a member's peers authenticate each other with: join without --etcd-peer-listen")
			return
		}
		initial, err = s.state.AddMember(r.Context(), req.EtcdName, req.EtcdPeerURLs)
		switch {
		case errors.Is(err, state.ErrMemberExists) || errors.Is(err, state.ErrNoPeers):
			refuse(http.StatusConflict, err.Error())
			return
		case err != nil:
			refuse(http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	s.log.Info("an API server is joining with a join token: it is handed the CA and the data key", "token_id", rec.ID, "remote", r.RemoteAddr, "etcd_member", req.EtcdName)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(membership.ServerJoinAnswer{
		EtcdEndpoints: eps, EtcdInitialCluster: initial, DataKey: s.dataKeyText(), ClusterToken: s.token,
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
	member := len(cfg.EtcdPeerURLs) > 0
	if len(cfg.EtcdClientURLs) > 0 && !member {
		return fail(errors.New("a joined server uses the cluster's etcd: --etcd-listen goes with --join only with --etcd-peer-listen, for a member of the cluster's etcd"))
	}
	if member && (len(cfg.EtcdClientURLs) == 0 || len(cfg.EtcdEndpoints) > 0) {
		return fail(errors.New("a server that joins with a member of the cluster's etcd (--etcd-peer-listen) serves its clients at --etcd-listen, and uses no --etcd-endpoints"))
	}
	if member && cfg.EtcdName == "" {
		cfg.EtcdName, _ = os.Hostname()
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
		switch {
		case rec.EtcdInitialCluster != "" && !member:
			return fail(fmt.Errorf("this server runs member %q of the cluster's etcd: start it with --etcd-listen and --etcd-peer-listen, as it joined (or remove the member with 'aenv cluster etcd remove %s' on another server, and join again with a fresh --data-dir)", rec.EtcdName, rec.EtcdName))
		case rec.EtcdInitialCluster != "":
			cfg.EtcdName, cfg.EtcdInitialCluster = rec.EtcdName, rec.EtcdInitialCluster
		case member:
			return fail(errors.New("this server joined using the cluster's etcd, without a member of its own: start it without --etcd-listen and --etcd-peer-listen, or join with a fresh --data-dir"))
		case len(cfg.EtcdEndpoints) == 0:
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
	req := membership.ServerJoinRequest{Token: token}
	if member {
		req.EtcdName, req.EtcdPeerURLs = cfg.EtcdName, cfg.EtcdPeerURLs
	}
	ans, err := postServerJoin(ctx, cfg.Join, pki.PinnedConfig(cfg.CAHash, pki.RoleServer, func(v *pki.Verifier) { pinned = v }), req)
	if err != nil {
		return fail(err)
	}
	if len(ans.EtcdEndpoints) == 0 {
		return fail(errors.New("the answer names no etcd endpoints"))
	}
	if member && ans.EtcdInitialCluster == "" {
		return fail(errors.New("the answer does not add this server's etcd member (is the server older?)"))
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
	jr := joinedRecord{URL: cfg.Join, CAHash: ca.Hash(), EtcdEndpoints: ans.EtcdEndpoints}
	if member {
		jr.EtcdName, jr.EtcdInitialCluster = cfg.EtcdName, ans.EtcdInitialCluster
		cfg.EtcdInitialCluster = ans.EtcdInitialCluster
	} else if len(cfg.EtcdEndpoints) == 0 {
		cfg.EtcdEndpoints = ans.EtcdEndpoints
	}
	rec, _ := json.Marshal(jr)
	if err := pki.WriteSecret(joinedFile(cfg.DataDir), rec); err != nil {
		return fail(err)
	}
	log.Info("joined the cluster as a server: its CA, data key and cluster token are in the data directory", "ca_hash", ca.Hash(), "etcd", ans.EtcdEndpoints, "etcd_member", jr.EtcdName)
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
func postServerJoin(ctx context.Context, url string, tcfg *tls.Config, jr membership.ServerJoinRequest) (membership.ServerJoinAnswer, error) {
	var ans membership.ServerJoinAnswer
	body, _ := json.Marshal(jr)
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
