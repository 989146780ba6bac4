package cli

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/store"
)

// newImageServerCmd is the process a node starts to serve its block
// images (blockimage.Server): hidden, as the node runs it itself.
func newImageServerCmd() *cobra.Command {
	var socket, workDir, cacheDir, storeURL, cacheSize string
	var grace, traceWindow time.Duration
	cmd := &cobra.Command{
		Use:    "image-server",
		Short:  "Serve this node's block images (started by aenv server and aenv node)",
		Hidden: true,
		Args:   cobra.NoArgs,
		Long: `Serve this node's block images: the mounts sandboxes' root filesystems
are on, read on demand from the store into a bounded local cache. A node
starts it when none answers on its socket, and it outlives the node, so that
restarting aenv server or aenv node never takes a running sandbox's files
away. It stops when asked over its socket (a node stopping with
--on-stop=kill) or on SIGTERM, unmounting its images.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			size, err := parseBytes(cacheSize)
			if err != nil {
				return &usageError{cmd: cmd, err: fmt.Errorf("--cache-size: %w", err)}
			}
			var st *store.Repository
			if storeURL != "" {
				backend, err := store.Open(cmd.Context(), storeURL, store.OpenOptions{})
				if err != nil {
					return fmt.Errorf("image server: opening the store: %w", err)
				}
				st, err = store.New(store.Options{Backend: backend, CacheDir: cacheDir, CacheMaxBytes: size, Logger: log})
				if err != nil {
					return fmt.Errorf("image server: opening the store: %w", err)
				}
				defer st.Close()
			}
			srv, err := blockimage.NewServer(blockimage.ServerConfig{Store: st, WorkDir: workDir, Grace: grace, TraceWindow: traceWindow, Logger: log})
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			// The node's session may end (a terminal closed): the image
			// server carries on.
			signal.Ignore(syscall.SIGHUP)
			return srv.Serve(ctx, socket)
		},
	}
	f := cmd.Flags()
	f.StringVar(&socket, "socket", "", "unix socket the node talks to it on")
	f.StringVar(&workDir, "work-dir", "", "directory the images are mounted under")
	f.StringVar(&cacheDir, "cache-dir", "", "the image cache: chunks fetched from the store")
	f.StringVar(&cacheSize, "cache-size", "10G", "bound of the image cache (bytes, or with K, M, G, T)")
	f.StringVar(&storeURL, "store", "", "the store images are fetched from (credentials from AWS_ACCESS_KEY_ID and the AWS default chain)")
	f.DurationVar(&grace, "grace", blockimage.DefaultGrace, "how long an image no sandbox uses stays mounted")
	f.DurationVar(&traceWindow, "trace-window", blockimage.DefaultTraceWindow, "how long after an image's first mount the chunks read are recorded as its prefetch list")
	for _, name := range []string{"socket", "work-dir", "cache-dir"} {
		cmd.MarkFlagRequired(name)
	}
	return cmd
}

// parseBytes reads a size in bytes, optionally with a K, M, G or T suffix
// (powers of 1024).
func parseBytes(s string) (int64, error) {
	t := strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "B")
	mult := int64(1)
	if n := len(t); n > 0 {
		if i := strings.IndexByte("KMGT", t[n-1]); i >= 0 {
			mult = 1 << (10 * (i + 1))
			t = strings.TrimSuffix(t[:n-1], "I")
		}
	}
	v, err := strconv.ParseInt(t, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("%q is not a size (bytes, or with K, M, G, T)", s)
	}
	return v * mult, nil
}
