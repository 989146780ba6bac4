package server

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/membership"
)

// APIKeyPath is where the generated key is kept under the data directory.
func APIKeyPath(dataDir string) string { return filepath.Join(dataDir, "secrets", "api-key") }

// loadAPIKey returns the override, else the stored key, else a new key it
// stores (mode 0600) and announces.
func loadAPIKey(dataDir, override string, log *slog.Logger) (string, error) {
	if override != "" {
		if !apikeys.ValidKey(override) {
			return "", fmt.Errorf("API key override must look like e2b_<hex> (E2B's SDKs refuse other keys)")
		}
		return override, nil
	}
	path := APIKeyPath(dataDir)
	if b, err := os.ReadFile(path); err == nil {
		key := strings.TrimSpace(string(b))
		if !apikeys.ValidKey(key) {
			return "", fmt.Errorf("reading API key: %s does not hold an e2b_<hex> key", path)
		}
		log.Info("using API key", "path", path)
		return key, nil
	} else if !os.IsNotExist(err) {
		return "", fmt.Errorf("reading API key: %w", err)
	}
	key := apikeys.NewKey()
	if err := membership.StoreSecret(path, key); err != nil {
		return "", fmt.Errorf("storing API key: %w", err)
	}
	log.Info("generated a new API key", "path", path)
	return key, nil
}
