package cli

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/server"
)

const defaultDataDir = "/var/lib/aenv"

func newServerCmd() *cobra.Command {
	var cfg server.Config
	var logLevel string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run the aenv server (API, proxy and a local node)",
		Long: `Run the aenv server: the E2B-compatible API and sandbox proxy, with an
in-process node that runs sandboxes under gVisor on this host.

On first start it generates an API key into <data-dir>/secrets/api-key
(mode 0600; AENV_API_KEY overrides) and builds the 'base' template from
Debian packages (a few minutes, once). Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return err
			}
			cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			if cfg.APIKey == "" {
				cfg.APIKey = os.Getenv("AENV_API_KEY")
			}
			ctx := cmd.Context()
			srv, err := server.Start(ctx, cfg)
			if err != nil {
				return err
			}
			<-ctx.Done()
			cfg.Logger.Info("shutting down: killing sandboxes")
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return srv.Close(sctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", ":8000", "address of the API and sandbox proxy")
	f.StringVar(&cfg.DataDir, "data-dir", defaultDataDir, "durable state: API key, templates")
	f.StringVar(&cfg.RunDir, "run-dir", "/run/aenv", "state that dies with the host: runsc state, network namespaces")
	f.StringVar(&cfg.RunscPath, "runsc", "", "runsc binary (default: from PATH)")
	f.StringVar(&cfg.EnvdPath, "envd", "", "static envd binary (default: beside aenv, then PATH)")
	f.StringVar(&cfg.BaseRootFS, "base-rootfs", os.Getenv("AENV_BASE_ROOTFS"), "prebuilt root filesystem for the base template (env AENV_BASE_ROOTFS)")
	f.StringVar(&cfg.SandboxCIDR, "sandbox-cidr", "10.231.0.0/16", "IPv4 range cut into one /30 per sandbox for host-side addresses")
	f.StringVar(&cfg.Domain, "domain", "", "domain sandbox hosts are reported under (<port>-<id>.<domain>; default localhost:<port>)")
	f.IntVar(&cfg.NetnsPoolSize, "netns-pool", 8, "network namespaces kept ready for new sandboxes")
	f.StringVar(&cfg.StoreURL, "store", os.Getenv("AENV_STORE"), "durable snapshot store: /shared/path, file:///path or s3://bucket/prefix?endpoint=URL&region=R&path_style=true (env AENV_STORE; default: the data dir only)")
	f.StringVar(&cfg.StoreAccessKey, "store-access-key", "", "S3 access key (default: AWS_ACCESS_KEY_ID and the AWS default chain)")
	f.StringVar(&cfg.StoreSecretKey, "store-secret-key", "", "S3 secret key (default: AWS_SECRET_ACCESS_KEY and the AWS default chain)")
	f.IntVar(&cfg.WarmPoolSize, "warm-pool", 2, "base sandboxes kept prestarted so that creates skip the boot (0 disables; each costs ~40 MiB)")
	f.Float64Var(&cfg.RateLimit, "rate-limit", 100, "control-plane requests per second per client address (0: unlimited); over it clients get 429 with Retry-After")
	f.IntVar(&cfg.RateBurst, "rate-burst", 200, "requests a client may send at once before --rate-limit applies")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "TLS certificate file (with --tls-key: serve HTTPS)")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "TLS private key file")
	f.StringVar(&cfg.NetnsTag, "netns-tag", "aenv", "names this server's nftables tables and host interfaces (lower-case letters; distinct per server on one host)")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	return cmd
}
