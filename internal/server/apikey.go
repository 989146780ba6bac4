package server

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// apiKeyPattern is the shape E2B's SDKs accept.
var apiKeyPattern = regexp.MustCompile(`^e2b_[0-9a-f]+$`)

// APIKeyPath is where the generated key is kept under the data directory.
func APIKeyPath(dataDir string) string { return filepath.Join(dataDir, "secrets", "api-key") }

// loadAPIKey returns the override, else the stored key, else a new key it
// stores (mode 0600) and announces.
func loadAPIKey(dataDir, override string, log *slog.Logger) (string, error) {
	if override != "" {
		if !apiKeyPattern.MatchString(override) {
			return "", fmt.Errorf("API key override must look like e2b_<hex> (E2B's SDKs refuse other keys)")
		}
		return override, nil
	}
	path := APIKeyPath(dataDir)
	if b, err := os.ReadFile(path); err == nil {
		key := strings.TrimSpace(string(b))
		if !apiKeyPattern.MatchString(key) {
			return "", fmt.Errorf("reading API key: %s does not hold an e2b_<hex> key", path)
		}
		log.Info("using API key", "path", path)
		return key, nil
	} else if !os.IsNotExist(err) {
		return "", fmt.Errorf("reading API key: %w", err)
	}
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	key := "e2b_" + hex.EncodeToString(b)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", fmt.Errorf("storing API key: %w", err)
	}
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("storing API key: %w", err)
	}
	log.Info("generated a new API key", "path", path)
	return key, nil
}
