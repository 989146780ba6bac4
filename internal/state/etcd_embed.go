package state

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

const (
	// embeddedName and embeddedPeerURL identify the one member of an
	// embedded cluster. They are fixed so that RestoreEmbedded can
	// rebuild the same membership.
	embeddedName  = "aenv"
	embeddedToken = "aenv-embedded"
	// embeddedPeerURL is advertised but never listened on: a one-member
	// cluster has no peer traffic, and etcd's peer listener takes only a
	// URL's host as a socket path, so no absolute path could be given.
	embeddedPeerURL = "unix://aenv-embedded-member-has-no-peers"

	// maxSocketPath is sun_path's 108 bytes less the terminating NUL.
	maxSocketPath = 107

	// readyTimeout bounds the wait for a member to serve; a healthy one
	// is ready in about a second, a damaged data dir never.
	readyTimeout = time.Minute

	// restoreRevisionBump lifts restored revisions far above any the old
	// cluster reached after the backup, so that no watcher sees revisions
	// go backwards; the restored history is marked compacted, so old
	// watchers get ErrCompacted and List again.
	restoreRevisionBump = 1_000_000_000
)

// MemberTLS is the TLS an etcd member serves with: its certificate and
// key, and the CA whose certificates every client (or peer) must present
// (client-certificate auth: with auth on, etcd takes a client's user name
// from its certificate's CommonName). etcd reads the certificate's files
// at every handshake, so a renewal replaces them in place.
type MemberTLS struct {
	CertFile, KeyFile, CAFile string
}

func (t *MemberTLS) info() transport.TLSInfo {
	return transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.CAFile,
		ClientCertAuth: true, MinVersion: tls.VersionTLS13}
}

// MemberConfig describes a standalone etcd member: for tests, and for
// clusters of several hosts.
type MemberConfig struct {
	Name    string
	DataDir string
	// ClientURLs and PeerURLs are the URLs to listen on and advertise:
	// https with TLS (PeerTLS), http on loopback, or http anywhere with
	// Insecure.
	ClientURLs, PeerURLs []string
	// AdvertiseClientURLs and AdvertisePeerURLs, if set, are advertised
	// instead: where clients and peers reach a member that listens on
	// every address, or on one that changes (a pod's IP) while its name
	// does not.
	AdvertiseClientURLs, AdvertisePeerURLs []string
	// TLS serves the client URLs, PeerTLS the peer URLs (nil: none).
	TLS, PeerTLS *MemberTLS
	// Insecure allows http URLs off loopback: state in the clear on the
	// network (--insecure-cluster).
	Insecure bool
	// InitialCluster is "name=peerURL,..." (default: this member alone).
	InitialCluster string
	// NewCluster bootstraps a new cluster rather than joining one.
	NewCluster bool
}

// RunMember runs an etcd member until ctx ends, with the same compaction
// and quota settings as the embedded one. It returns nil when ctx ends and
// an error if the member fails.
func RunMember(ctx context.Context, mc MemberConfig, log *slog.Logger) error {
	op := "running etcd member " + mc.Name
	for _, u := range mc.ClientURLs {
		if err := CheckURL(u, mc.TLS != nil, mc.Insecure); err != nil {
			return fmt.Errorf("%s: client URL: %w", op, err)
		}
	}
	for _, u := range mc.PeerURLs {
		if err := CheckURL(u, mc.PeerTLS != nil, mc.Insecure); err != nil {
			return fmt.Errorf("%s: peer URL: %w", op, err)
		}
	}
	for _, u := range append(slices.Clone(mc.AdvertiseClientURLs), mc.AdvertisePeerURLs...) {
		if err := CheckURL(u, mc.TLS != nil, mc.Insecure); err != nil {
			return fmt.Errorf("%s: advertised URL: %w", op, err)
		}
		if pu, err := url.Parse(u); err == nil && unspecified(pu.Hostname()) {
			return fmt.Errorf("%s: advertised URL %s: name an address others reach, not %s", op, u, pu.Hostname())
		}
	}
	var curls, purls, acurls, apurls []url.URL
	for _, l := range []struct {
		what string
		in   []string
		out  *[]url.URL
	}{
		{"client URLs", mc.ClientURLs, &curls}, {"peer URLs", mc.PeerURLs, &purls},
		{"advertised client URLs", orDefault(mc.AdvertiseClientURLs, mc.ClientURLs), &acurls},
		{"advertised peer URLs", orDefault(mc.AdvertisePeerURLs, mc.PeerURLs), &apurls},
	} {
		us, err := parseURLs(l.in)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", op, l.what, err)
		}
		*l.out = us
	}
	c := memberConfig(mc.Name, mc.DataDir, DefaultQuotaBytes, log)
	c.ListenClientUrls, c.AdvertiseClientUrls = curls, acurls
	c.ListenPeerUrls, c.AdvertisePeerUrls = purls, apurls
	if mc.TLS != nil {
		c.ClientTLSInfo = mc.TLS.info()
	}
	if mc.PeerTLS != nil {
		c.PeerTLSInfo = mc.PeerTLS.info()
	}
	c.InitialCluster = mc.InitialCluster
	if c.InitialCluster == "" {
		c.InitialCluster = c.InitialClusterFromName(mc.Name)
	}
	c.InitialClusterToken = "aenv"
	c.ClusterState = embed.ClusterStateFlagExisting
	if mc.NewCluster {
		c.ClusterState = embed.ClusterStateFlagNew
	}
	m, err := embed.StartEtcd(c)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	defer m.Close()
	select {
	case <-m.Server.ReadyNotify():
	case err := <-m.Err():
		return fmt.Errorf("%s: %w", op, err)
	case <-ctx.Done():
		return nil
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-m.Err():
		return fmt.Errorf("%s: %w", op, err)
	case <-m.Server.StopNotify():
		return fmt.Errorf("%s: member stopped", op)
	}
}

// URLHosts are the host names and addresses urls name, for a member's
// certificate: an unspecified address (listening everywhere) names no
// host of its own, and an unparsable URL none at all.
func URLHosts(urls []string) []string {
	var hosts []string
	for _, s := range urls {
		if u, err := url.Parse(s); err == nil && u.Hostname() != "" && !unspecified(u.Hostname()) {
			hosts = append(hosts, u.Hostname())
		}
	}
	return hosts
}

// unspecified reports whether host is 0.0.0.0 or ::, which no peer or
// client can be sent to.
func unspecified(host string) bool {
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

func orDefault(urls, def []string) []string {
	if len(urls) > 0 {
		return urls
	}
	return def
}

// startEmbedded starts the one member of a single-host cluster and
// returns it with the client endpoints to reach it.
func startEmbedded(ctx context.Context, cfg Config) (*embed.Etcd, []string, error) {
	if cfg.DataDir == "" {
		return nil, nil, errors.New("starting embedded etcd: no DataDir")
	}
	op := "starting embedded etcd in " + cfg.DataDir
	var endpoints []string
	if len(cfg.ClientURLs) > 0 {
		for _, s := range cfg.ClientURLs {
			if err := CheckURL(s, cfg.MemberTLS != nil, cfg.Insecure); err != nil {
				return nil, nil, fmt.Errorf("%s: client URL: %w", op, err)
			}
		}
		endpoints = cfg.ClientURLs
	} else {
		sock, err := socketPath(cfg.SocketDir)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", op, err)
		}
		// An absolute path after "unix://": etcd's client listener joins
		// the URL's host (empty) and path, and its client reads
		// "unix:///" as an absolute path.
		endpoints = []string{"unix://" + sock}
	}
	curls, err := parseURLs(endpoints)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	purls, err := parseURLs([]string{embeddedPeerURL})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	name := cfg.MemberName
	if name == "" {
		name = embeddedName
	}
	c := memberConfig(name, cfg.DataDir, cfg.QuotaBytes, cfg.Logger)
	c.ListenClientUrls, c.AdvertiseClientUrls = curls, curls
	c.ListenPeerUrls, c.AdvertisePeerUrls = nil, purls
	if cfg.MemberTLS != nil {
		c.ClientTLSInfo = cfg.MemberTLS.info()
	}
	c.InitialCluster = name + "=" + embeddedPeerURL
	// A member without peers still waits out an election timeout before
	// it leads and serves (etcd fast-forwards a lone member to its last
	// tick, so it campaigns 1 to ElectionMs/TickMs ticks after it starts):
	// with no network between members there is no jitter to allow for, so
	// a short one shortens every server start. The tick is not shorter
	// than it needs: raft ticks for the life of the server, and at 10 ms
	// its two goroutines were the most frequent wakeups of an idle server.
	// Measured here, 3 runs each of an idle server: 16.3 -> 11.7 CPU-ms/s
	// (median) against 10 ms; the state store ready in 23-76 ms with
	// either (with 100 ms ticks it took 430-520 ms).
	c.TickMs, c.ElectionMs = 20, 100
	c.InitialClusterToken = embeddedToken
	c.ClusterState = embed.ClusterStateFlagNew
	if len(cfg.PeerURLs) > 0 {
		if err := peerConfig(c, cfg, endpoints); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", op, err)
		}
	}

	m, err := embed.StartEtcd(c)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", op, err)
	}
	timer := time.NewTimer(readyTimeout)
	defer timer.Stop()
	select {
	case <-m.Server.ReadyNotify():
		if len(cfg.PeerURLs) == 0 {
			return m, endpoints, nil
		}
		if endpoints, err = settleMember(ctx, m, cfg, endpoints); err == nil {
			return m, endpoints, nil
		}
		err = fmt.Errorf("%s: %w", op, err)
	case err = <-m.Err():
		err = fmt.Errorf("%s: %w", op, err)
	case <-timer.C:
		err = fmt.Errorf("%s: not ready after %s (is the data dir damaged, or held by another process?)", op, readyTimeout)
	case <-ctx.Done():
		err = fmt.Errorf("%s: %w", op, ctx.Err())
	}
	m.Close()
	return nil, nil, err
}

// memberConfig holds the settings every member shares.
func memberConfig(name, dir string, quota int64, log *slog.Logger) *embed.Config {
	c := embed.NewConfig()
	c.Name = name
	c.Dir = dir
	c.QuotaBackendBytes = quota
	// Periodic compaction keeps five minutes of history whatever the
	// write rate, so a watcher that reconnects within that time (an API
	// server restarting, a network blip) resumes without a full List of
	// every record; a revision count would give a busy cluster seconds.
	// The space it costs is the write rate times five minutes, far below
	// the quota for our records.
	c.AutoCompactionMode = embed.CompactorModePeriodic
	c.AutoCompactionRetention = "5m"
	// A restart reads the write-ahead log from the last snapshot on: a
	// snapshot every 2,000 entries (etcd's default is 10,000) keeps that
	// read, and so a server's start, short even when each entry is a big
	// transaction.
	c.SnapshotCount = 2000
	// etcd logs every election and snapshot at info; we want only what
	// needs an operator.
	c.Logger = "zap"
	c.LogLevel = "error"
	c.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.New(newSlogCore(log.With("component", "etcd"))))
	// The HTTP gateway and metrics listeners would be more surface for
	// nothing: we speak gRPC only.
	c.EnableGRPCGateway = false
	c.ListenMetricsUrls = nil
	return c
}

// SocketName is the embedded member's socket in SocketDir. It is fixed so
// that other commands (aenv state backup) find a running server's etcd.
const SocketName = "etcd.sock"

// socketPath returns the socket in dir, refusing one that a live member
// serves: etcd removes whatever file is at its path before listening, and
// would cut off the running server's clients before its data-dir lock
// stopped this one.
func socketPath(dir string) (string, error) {
	if dir == "" {
		return "", errors.New("no SocketDir for the unix socket")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("resolving socket dir %s: %w", dir, err)
	}
	p := filepath.Join(dir, SocketName)
	if len(p) > maxSocketPath {
		return "", fmt.Errorf("socket path %s is %d bytes, over the %d a unix socket allows: use a shorter run dir", p, len(p), maxSocketPath)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("creating socket dir: %w", err)
	}
	if c, err := net.DialTimeout("unix", p, time.Second); err == nil {
		c.Close()
		return "", fmt.Errorf("socket %s: another etcd member is serving there", p)
	}
	return p, nil
}

func parseURLs(ss []string) ([]url.URL, error) {
	us, err := types.NewURLs(ss)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", strings.Join(ss, ","), err)
	}
	return us, nil
}

// CheckURL checks an etcd URL to listen on or dial: the state crosses
// the network only over TLS. https needs TLS (the member's, or the
// client's); http is for loopback only, unless insecure
// (--insecure-cluster); a unix socket is local.
func CheckURL(s string, tls, insecure bool) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("parsing etcd URL %s: %w", s, err)
	}
	switch u.Scheme {
	case "unix":
		return nil
	case "https":
		if !tls {
			return fmt.Errorf("etcd URL %s: https without TLS certificates", s)
		}
		return nil
	case "http":
		if insecure || isLoopback(u.Hostname()) {
			return nil
		}
		return fmt.Errorf("etcd URL %s: plain http off loopback carries the cluster's state in the clear; use https (with the cluster's certificates), or --insecure-cluster", s)
	}
	return fmt.Errorf("etcd URL %s: want https, http (loopback) or unix", s)
}

func isLoopback(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || (ip != nil && ip.IsLoopback())
}

// RestoreEmbedded rebuilds an embedded member's DataDir from a Backup.
// The member must be stopped. The old dir is moved aside to
// dataDir+".old-<time>", never deleted, so a bad restore can be undone.
func RestoreEmbedded(ctx context.Context, snapshotFile, dataDir string) error {
	op := fmt.Sprintf("restoring %s into %s", snapshotFile, dataDir)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	stamp := time.Now().UTC().Format("20060102T150405Z")
	tmp := dataDir + ".restoring-" + stamp
	err := snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        snapshotFile,
		Name:                embeddedName,
		OutputDataDir:       tmp,
		PeerURLs:            []string{embeddedPeerURL},
		InitialCluster:      embeddedName + "=" + embeddedPeerURL,
		InitialClusterToken: embeddedToken,
		RevisionBump:        restoreRevisionBump,
		MarkCompacted:       true,
	})
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("%s: %w", op, err)
	}
	if _, err := os.Stat(dataDir); err == nil {
		if err := os.Rename(dataDir, dataDir+".old-"+stamp); err != nil {
			os.RemoveAll(tmp)
			return fmt.Errorf("%s: moving the old data aside: %w", op, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		os.RemoveAll(tmp)
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := os.Rename(tmp, dataDir); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// slogCore hands etcd's zap records to slog, so its errors land in our
// log with our format, and nothing below its level is even formatted.
type slogCore struct {
	log    *slog.Logger
	min    zapcore.Level
	fields []zapcore.Field
}

func newSlogCore(log *slog.Logger) zapcore.Core {
	return &slogCore{log: log, min: zapcore.ErrorLevel}
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= c.min }

func (c *slogCore) With(fs []zapcore.Field) zapcore.Core {
	return &slogCore{log: c.log, min: c.min, fields: append(slices.Clip(c.fields), fs...)}
}

func (c *slogCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *slogCore) Write(ent zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fs {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	attrs := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		attrs = append(attrs, k, enc.Fields[k])
	}
	level := slog.LevelError
	if ent.Level < zapcore.ErrorLevel {
		level = slog.LevelWarn
	}
	// etcd reports its own listeners closing under it as errors on every
	// clean stop; that is not news for an operator.
	if e, ok := enc.Fields["error"].(string); ok && (strings.Contains(e, "server closed") ||
		strings.Contains(e, "Server closed") || strings.Contains(e, "use of closed network connection")) {
		level = slog.LevelDebug
	}
	c.log.Log(context.Background(), level, ent.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
