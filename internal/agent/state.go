package agent

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/state"
)

// OpenState opens the live state: the external etcd cluster, waiting
// (with backoff, logging why) until it answers, or the embedded member.
func OpenState(ctx context.Context, cfg Config, log *slog.Logger) (*state.Etcd, error) {
	start := time.Now()
	for _, ep := range cfg.EtcdEndpoints {
		if strings.HasPrefix(ep, "https://") {
			continue
		}
		if err := membership.CheckPlain("the state store (etcd)", ep, "give https --etcd-endpoints with --etcd-ca, --etcd-cert and --etcd-key", cfg.InsecureCluster); err != nil {
			return nil, fmt.Errorf("opening the state store: %w", err)
		}
	}
	st, err := state.Open(ctx, state.Config{
		Endpoints: cfg.EtcdEndpoints,
		CAFile:    cfg.EtcdCAFile, CertFile: cfg.EtcdCertFile, KeyFile: cfg.EtcdKeyFile,
		DataDir:    filepath.Join(cfg.DataDir, "etcd"),
		SocketDir:  cfg.RunDir,
		ClientURLs: cfg.EtcdClientURLs,
		Logger:     log,
	})
	if err != nil {
		return nil, fmt.Errorf("opening the state store: %w", err)
	}
	if err := st.WaitReady(ctx); err != nil {
		st.Close()
		return nil, fmt.Errorf("waiting for the state store: %w", err)
	}
	log.Info("state store ready", "etcd", strings.Join(st.Endpoints(), ","), "embedded", len(cfg.EtcdEndpoints) == 0,
		"took_ms", time.Since(start).Milliseconds())
	return st, nil
}
