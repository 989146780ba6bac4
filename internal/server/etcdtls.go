package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/state"
)

// etcdWithClusterCA reports whether this server's etcd serves TLS with
// certificates of the cluster's CA, and so has client-certificate auth
// and RBAC (membership's etcd users): the embedded member with https
// --etcd-listen URLs, or external members (`aenv etcd --ca-dir`) at https
// --etcd-endpoints that no --etcd-cert of the operator's own names.
func etcdWithClusterCA(cfg agent.Config) bool {
	if len(cfg.EtcdEndpoints) == 0 {
		return agent.HTTPSEndpoints(cfg.EtcdClientURLs)
	}
	return agent.HTTPSEndpoints(cfg.EtcdEndpoints) && cfg.EtcdCertFile == "" && cfg.EtcdKeyFile == "" && cfg.EtcdCAFile == ""
}

// openEtcdTLS issues the certificates of an etcd with the cluster's CA
// (nil when it has none, etcdWithClusterCA): the embedded member's, and
// the one servers reach it with. The CA is in etcd, which cannot be read
// before it serves: it comes from <data-dir>/secrets/ca.{crt,key}, made
// here at the embedded member's first start, and recorded in the state
// by LoadCA once etcd serves.
func openEtcdTLS(cfg Config, log *slog.Logger) (*membership.EtcdTLS, error) {
	if !etcdWithClusterCA(cfg.Config) {
		return nil, nil
	}
	files := membership.CAFiles(cfg.DataDir)
	embedded := len(cfg.EtcdEndpoints) == 0
	create := false
	if embedded {
		_, err := os.Stat(filepath.Join(cfg.DataDir, "etcd"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("reading the embedded etcd's data dir: %w", err)
		}
		// A member with data has its CA's record: a new CA would not be
		// the cluster's.
		create = errors.Is(err, os.ErrNotExist)
	}
	ca, err := membership.BootstrapCA(files, create, log)
	if err != nil {
		if embedded {
			err = fmt.Errorf("%w (the embedded etcd in %s has data: start the server once without https --etcd-listen, and it writes them from the state)", err, filepath.Join(cfg.DataDir, "etcd"))
		}
		return nil, fmt.Errorf("serving etcd over TLS: %w", err)
	}
	ecfg := membership.EtcdTLSConfig{CA: ca, Client: true, Lifetime: cfg.Trust.CertLifetime, Logger: log}
	if embedded {
		mf := membership.EtcdMemberFiles(membership.SecretsDir(cfg.DataDir))
		ecfg.Member, ecfg.MemberName = &mf, cfg.EtcdName
		if ecfg.MemberName == "" {
			ecfg.MemberName = "aenv"
		}
		hostname, _ := os.Hostname()
		ecfg.MemberHosts = append(ecfg.MemberHosts, hostname)
		// Its peers check the host names of its peer URLs as clients
		// check its client URLs'.
		ecfg.MemberHosts = append(ecfg.MemberHosts, state.URLHosts(slices.Concat(cfg.EtcdClientURLs, cfg.EtcdPeerURLs))...)
		for _, a := range []string{cfg.Trust.ClusterAdvertise, cfg.Advertise} {
			if h, _, err := net.SplitHostPort(a); err == nil && h != "" {
				ecfg.MemberHosts = append(ecfg.MemberHosts, h)
			}
		}
	}
	return membership.OpenEtcdTLS(ecfg)
}
