package image

import (
	"fmt"
	"os"

	"github.com/docker/cli/cli/config"
	"github.com/docker/cli/cli/config/configfile"
	"github.com/docker/cli/cli/config/types"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// LoadRegistryAuth reads registry credentials from file, in Docker's
// config.json format (`auths`, and `credHelpers`/`credsStore` naming
// helpers), for PullOptions.Keychain: the credentials the operator gave
// the server (--registry-auth), and only those. Registries the file does
// not name are pulled from anonymously.
func LoadRegistryAuth(file string) (authn.Keychain, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("reading registry credentials %s: %w", file, err)
	}
	defer f.Close()
	cf, err := config.LoadFromReader(f)
	if err != nil {
		return nil, fmt.Errorf("reading registry credentials %s: %w", file, err)
	}
	return fileKeychain{cf: cf}, nil
}

// fileKeychain resolves credentials from one Docker config file, looked
// up as Docker looks them up: the repository, then its registry (Docker
// Hub under its historical key).
type fileKeychain struct{ cf *configfile.ConfigFile }

func (k fileKeychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	var empty types.AuthConfig
	for _, key := range []string{target.String(), target.RegistryStr()} {
		if key == name.DefaultRegistry {
			key = authn.DefaultAuthKey
		}
		cfg, err := k.cf.GetAuthConfig(key)
		if err != nil {
			return nil, fmt.Errorf("looking up credentials for %s: %w", key, err)
		}
		// GetAuthConfig fills in the address it was asked for; what counts
		// is whether it found any credential.
		cfg.ServerAddress = ""
		if cfg != empty {
			return authn.FromConfig(authn.AuthConfig{
				Username: cfg.Username, Password: cfg.Password, Auth: cfg.Auth,
				IdentityToken: cfg.IdentityToken, RegistryToken: cfg.RegistryToken,
			}), nil
		}
	}
	return authn.Anonymous, nil
}
