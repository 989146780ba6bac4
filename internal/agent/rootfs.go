package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/store"
)

// Root filesystem modes (Config.RootFS).
const (
	RootFSImage = "image"
	RootFSEager = "eager"
	RootFSDir   = "dir"
)

// ImageStoreOptions cut block images where their content says (at page
// boundaries, about 320 KiB apart, at most 1 MiB): erofs lays a file's
// data out whole and in order, so two images that share files (a base
// and a template built on it) share those chunks, where fixed-size cuts
// shift with every file added before them. Small chunks also make a read
// on demand fetch less: measured on the code-interpreter image
// (BenchmarkImageStart, python importing numpy and pandas, cold), fixed
// 1 MiB chunks fetched 34% of the stored image, fixed 256 KiB 20%, these
// 15%.
func ImageStoreOptions(b store.Backend) store.Options {
	return store.Options{Backend: b, ChunkSize: 1 << 20, ContentDefined: true}
}

// openRootFS starts (or takes over) the node's image server and returns
// the root filesystem provider sandboxes get their template's files from.
func openRootFS(ctx context.Context, cfg Config, envdPath string, log *slog.Logger) (node.RootFSProvider, *blockimage.Client, error) {
	switch cfg.RootFS {
	case RootFSDir:
		return node.DirRootFS{}, nil, nil
	case "", RootFSImage, RootFSEager:
	default:
		return nil, nil, fmt.Errorf("--rootfs %q: want image, eager or dir", cfg.RootFS)
	}
	bin, err := findAenv(cfg.AenvPath, envdPath)
	if err != nil {
		return nil, nil, err
	}
	dir := filepath.Join(cfg.RunDir, "images")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("starting the image server: %w", err)
	}
	cacheSize := cfg.ImageCacheSize
	if cacheSize <= 0 {
		cacheSize = defaultImageCacheSize(cfg.DataDir)
	}
	args := []string{"image-server", "--socket", filepath.Join(dir, "server.sock"), "--work-dir", filepath.Join(dir, "mounts"),
		"--cache-dir", filepath.Join(cfg.DataDir, "image-cache"), "--cache-size", strconv.FormatInt(cacheSize, 10)}
	if cfg.StoreURL != "" {
		args = append(args, "--store", cfg.StoreURL)
	}
	if cfg.ImageGrace > 0 {
		args = append(args, "--grace", cfg.ImageGrace.String())
	}
	var env []string
	if cfg.StoreAccessKey != "" {
		env = append(env, "AWS_ACCESS_KEY_ID="+cfg.StoreAccessKey, "AWS_SECRET_ACCESS_KEY="+cfg.StoreSecretKey)
	}
	client := blockimage.NewClient(filepath.Join(dir, "server.sock"))
	info, err := client.Start(ctx, blockimage.StartOptions{Binary: bin, Args: args, Env: env, LogFile: filepath.Join(dir, "server.log")})
	if err != nil {
		return nil, nil, err
	}
	if info.Version != blockimage.Version {
		return nil, nil, fmt.Errorf("the image server running (pid %d) speaks version %q, this aenv %q: it serves sandboxes of the previous aenv; stop them, or the image server, first", info.PID, info.Version, blockimage.Version)
	}
	log.Info("image server ready", "pid", info.PID, "images_mounted", len(info.Images), "cache_bytes", cacheSize, "log", filepath.Join(dir, "server.log"))
	return &node.ImageRootFS{Client: client, Eager: cfg.RootFS == RootFSEager, WorkDir: filepath.Join(cfg.RunDir, "node", "rootfs")}, client, nil
}

// defaultImageCacheSize is 20% of the disk holding dir.
func defaultImageCacheSize(dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 10 << 30
	}
	return int64(st.Blocks) * st.Bsize / 5
}

// findAenv finds the aenv binary that runs the image server.
func findAenv(explicit, envdPath string) (string, error) {
	if explicit != "" {
		return explicit, nil
	}
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "aenv" {
		return exe, nil
	}
	p := filepath.Join(filepath.Dir(envdPath), "aenv")
	if _, err := os.Stat(p); err != nil {
		return "", errors.New("finding the aenv binary for the image server: none beside envd (build it with `make build`)")
	}
	return p, nil
}
