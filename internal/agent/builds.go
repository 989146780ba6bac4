package agent

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/aenvhq/aenv/internal/build"
	"github.com/aenvhq/aenv/internal/image"
	"github.com/aenvhq/aenv/internal/node/nodeserver"
	"github.com/aenvhq/aenv/internal/template"
)

// DefaultMaxImageBytes bounds pulled images unless --max-image-size says
// otherwise.
const DefaultMaxImageBytes = 10 << 30

// orDefault reads a bound: 0 is def, negative none (0).
func orDefault(v, def int64) int64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// MaxImageBytes is cfg's bound of pulled images (0: none).
func MaxImageBytes(cfg Config) int64 { return orDefault(cfg.MaxImageBytes, DefaultMaxImageBytes) }

// RegistryAuth loads cfg's registry credentials (nil: none given).
func RegistryAuth(cfg Config) (authn.Keychain, error) {
	if cfg.RegistryAuth == "" {
		return nil, nil
	}
	kc, err := image.LoadRegistryAuth(cfg.RegistryAuth)
	if err != nil {
		return nil, fmt.Errorf("--registry-auth: %w", err)
	}
	return kc, nil
}

// buildConfig is what the host's node runs template builds with: the
// limits of each build, its build slots, the size of images, the registry
// credentials. It first removes the build disks and contexts a previous
// process left.
func buildConfig(cfg Config, steps build.Stepper, templates *template.Catalog) (*nodeserver.BuildConfig, error) {
	lim := build.Limits{
		MemoryMB:      int(orDefault(int64(cfg.BuildMemoryMB), build.DefaultMemoryMB)),
		CPUCount:      int(orDefault(int64(cfg.BuildCPUs), build.DefaultCPUCount)),
		PidsLimit:     cfg.PidsLimit, // 0: the node's default for sandboxes
		DiskBytes:     orDefault(cfg.BuildDiskBytes, build.DefaultDiskBytes),
		DiskDir:       filepath.Join(cfg.DataDir, "builds"),
		MaxImageBytes: MaxImageBytes(cfg),
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
	if err := build.RemoveDisks(lim.DiskDir); err != nil {
		return nil, err
	}
	ctxDir := filepath.Join(cfg.DataDir, "build-contexts")
	if err := os.RemoveAll(ctxDir); err != nil {
		return nil, fmt.Errorf("removing the build contexts a previous run left: %w", err)
	}
	kc, err := RegistryAuth(cfg)
	if err != nil {
		return nil, err
	}
	return &nodeserver.BuildConfig{
		Steps: steps, Templates: templates, Limits: lim, Slots: build.NewSlots(maxBuilds),
		Keychain: kc, ContextDir: ctxDir, Logger: cfg.Logger,
	}, nil
}

// pullConfig is what the host's node pulls templates with: the size of
// images and the registry credentials, as its builds' FROM images.
func pullConfig(cfg Config, templates *template.Catalog) (*nodeserver.PullConfig, error) {
	kc, err := RegistryAuth(cfg)
	if err != nil {
		return nil, err
	}
	return &nodeserver.PullConfig{
		Templates: templates, MaxImageBytes: MaxImageBytes(cfg), Keychain: kc, Logger: cfg.Logger,
	}, nil
}
