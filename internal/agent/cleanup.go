package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/runtime/gvisor"
	"github.com/aenvhq/aenv/internal/volume"
)

// Cleanup removes every sandbox and network slot that a stopped server
// with this configuration left running on the host (sandboxes outlive
// their server; see Config.OnStop), for uninstalling. It refuses while a
// server uses the same run directory.
func Cleanup(ctx context.Context, cfg Config) error {
	cfg = cfg.WithDefaults()
	prefix, err := netip.ParsePrefix(cfg.SandboxCIDR)
	if err != nil {
		return fmt.Errorf("parsing sandbox CIDR %q: %w", cfg.SandboxCIDR, err)
	}
	netCfg := netns.Config{RunDir: filepath.Join(cfg.RunDir, "netns"), Prefix: prefix, Tag: cfg.NetnsTag, Logger: cfg.Logger}
	// Reap fails with ErrBusy while a server holds the run directory:
	// check that before touching its sandboxes.
	if err := netns.Reap(ctx, netCfg); err != nil {
		return fmt.Errorf("cleaning up: %w", err)
	}
	// No server holds the run directory: once its sandboxes are gone
	// (below), so goes the image server serving their roots, and what a
	// killed one left mounted, whatever else fails.
	images := filepath.Join(cfg.RunDir, "images")
	defer func() {
		if err := blockimage.NewClient(filepath.Join(images, "server.sock")).Stop(ctx); err != nil {
			cfg.Logger.Warn("stopping the image server", "err", err)
		}
		blockimage.Sweep(filepath.Join(images, "mounts"), cfg.Logger)
	}()
	// Without PidsTotal: cleaning up must not set the host's limits.
	driver, err := gvisor.New(gvisorConfig(cfg, cfg.Logger))
	if err != nil {
		return fmt.Errorf("cleaning up: %w", err)
	}
	errs := []error{driver.Cleanup(ctx), driver.Close()}
	overlays := filepath.Join(cfg.RunDir, "node", "rootfs")
	entries, _ := os.ReadDir(overlays)
	for _, e := range entries {
		errs = append(errs, node.ReleaseOverlay(overlays, e.Name()))
	}
	errs = append(errs, os.RemoveAll(filepath.Join(cfg.RunDir, "node")))
	// The volumes' images, mounted while the server ran, no sandbox uses
	// now.
	if vols := filepath.Join(cfg.DataDir, "volumes"); cfg.DataDir != "" {
		if _, err := os.Stat(vols); err == nil {
			d, err := volume.Open(vols)
			if err == nil {
				err = d.UnmountAll()
			}
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cleaning up: %w", err)
	}
	return nil
}
