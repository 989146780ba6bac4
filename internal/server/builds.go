package server

import (
	"fmt"
	"path/filepath"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/build"
	"github.com/aenvhq/aenv/internal/image"
)

// DefaultMaxImageBytes bounds pulled images unless --max-image-size says
// otherwise.
const DefaultMaxImageBytes = 10 << 30

// setBuildBounds gives the API the bounds of template builds and pulls:
// the limits of each build, the node's build slots, the size of images,
// the registry credentials. With a local node (which runs the builds) it
// first removes the build disks a previous process left.
func setBuildBounds(acfg *api.Config, cfg Config, localNode bool) error {
	orDefault := func(v, def int64) int64 {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	lim := build.Limits{
		MemoryMB:      int(orDefault(int64(cfg.BuildMemoryMB), build.DefaultMemoryMB)),
		CPUCount:      int(orDefault(int64(cfg.BuildCPUs), build.DefaultCPUCount)),
		PidsLimit:     cfg.PidsLimit, // 0: the node's default for sandboxes
		DiskBytes:     orDefault(cfg.BuildDiskBytes, build.DefaultDiskBytes),
		DiskDir:       filepath.Join(cfg.DataDir, "builds"),
		MaxImageBytes: orDefault(cfg.MaxImageBytes, DefaultMaxImageBytes),
	}
	lim.Timeout = cfg.BuildTimeout
	switch {
	case lim.Timeout == 0:
		lim.Timeout = build.DefaultTimeout
	case lim.Timeout < 0:
		lim.Timeout = 0
	}
	maxBuilds := cfg.MaxBuilds
	if maxBuilds <= 0 {
		maxBuilds = build.DefaultMaxBuilds
	}
	if localNode {
		if err := build.RemoveDisks(lim.DiskDir); err != nil {
			return err
		}
	}
	acfg.BuildLimits, acfg.BuildSlots = lim, build.NewSlots(maxBuilds)
	acfg.MaxImageBytes = lim.MaxImageBytes
	if cfg.RegistryAuth != "" {
		kc, err := image.LoadRegistryAuth(cfg.RegistryAuth)
		if err != nil {
			return fmt.Errorf("--registry-auth: %w", err)
		}
		acfg.RegistryAuth = kc
	}
	return nil
}
