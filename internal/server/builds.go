package server

import (
	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/api"
)

// DefaultMaxImageBytes bounds pulled images unless --max-image-size says
// otherwise.
const DefaultMaxImageBytes = agent.DefaultMaxImageBytes

// setPullBounds gives the API the bounds of the pulls it runs itself: the
// size of images and the registry credentials. Builds' bounds are the
// node's (agent.Config), which runs them.
func setPullBounds(acfg *api.Config, cfg Config) error {
	acfg.MaxImageBytes = agent.MaxImageBytes(cfg.Config)
	kc, err := agent.RegistryAuth(cfg.Config)
	if err != nil {
		return err
	}
	acfg.RegistryAuth = kc
	return nil
}
