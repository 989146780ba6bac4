package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// StateTLS is the TLS of the live state with the cluster's CA (its zero
// value: the files of Config.EtcdCAFile and the others, or none).
type StateTLS struct {
	// Member is the embedded member's, for https EtcdClientURLs.
	Member *state.MemberTLS
	// Client is what this process dials etcd with.
	Client *tls.Config
}

// OpenState opens the live state: the external etcd cluster, waiting
// (with backoff, logging why) until it answers, or the embedded member.
func OpenState(ctx context.Context, cfg Config, stls StateTLS, log *slog.Logger) (*state.Etcd, error) {
	start := time.Now()
	st, err := state.Open(ctx, state.Config{
		Endpoints: cfg.EtcdEndpoints,
		CAFile:    cfg.EtcdCAFile, CertFile: cfg.EtcdCertFile, KeyFile: cfg.EtcdKeyFile,
		ClientTLS:  stls.Client,
		DataDir:    filepath.Join(cfg.DataDir, "etcd"),
		SocketDir:  cfg.RunDir,
		ClientURLs: cfg.EtcdClientURLs,
		PeerURLs:   cfg.EtcdPeerURLs, MemberName: cfg.EtcdName, InitialCluster: cfg.EtcdInitialCluster,
		MemberTLS: stls.Member,
		Insecure:  cfg.InsecureCluster,
		Logger:    log,
	})
	if err != nil {
		return nil, fmt.Errorf("opening the state store: %w", err)
	}
	if err := st.WaitReady(ctx); err != nil {
		st.Close()
		if errors.Is(err, state.ErrDenied) && stls.Client == nil {
			// An embedded member that served https once keeps its auth.
			return nil, fmt.Errorf("waiting for the state store: %w (etcd's auth is on, as it is where etcd served https with the cluster's CA: reach it over https, e.g. --etcd-listen https://ADDR:PORT for the embedded member)", err)
		}
		return nil, fmt.Errorf("waiting for the state store: %w", err)
	}
	log.Info("state store ready", "etcd", strings.Join(st.Endpoints(), ","), "embedded", len(cfg.EtcdEndpoints) == 0,
		"took_ms", time.Since(start).Milliseconds())
	return st, nil
}

// HTTPSEndpoints reports whether any of eps is an https URL.
func HTTPSEndpoints(eps []string) bool {
	for _, e := range eps {
		if strings.HasPrefix(e, "https://") {
			return true
		}
	}
	return false
}
