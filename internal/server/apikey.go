package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/aenvhq/aenv/internal/apikeys"
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
	if err := storeSecret(path, key); err != nil {
		return "", fmt.Errorf("storing API key: %w", err)
	}
	log.Info("generated a new API key", "path", path)
	return key, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// storeSecret writes value to path, readable by its owner only.
func storeSecret(path, value string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(value+"\n"), 0o600)
}

// ClusterTokenPath is where a server keeps the cluster token under its
// data directory.
func ClusterTokenPath(dataDir string) string {
	return filepath.Join(dataDir, "secrets", "cluster-token")
}

// ClusterTokenEnv overrides the stored cluster token.
const ClusterTokenEnv = "AENV_CLUSTER_TOKEN"

// loadClusterToken returns the token servers and nodes authenticate each
// other with: the override, else $AENV_CLUSTER_TOKEN, else the stored
// one, else (generate true: a server) a new one it stores.
func loadClusterToken(dataDir, override string, generate bool, log *slog.Logger) (string, error) {
	if override == "" {
		override = os.Getenv(ClusterTokenEnv)
	}
	if override != "" {
		if len(override) < 16 {
			return "", errors.New("the cluster token must be at least 16 characters")
		}
		return override, nil
	}
	path := ClusterTokenPath(dataDir)
	if b, err := os.ReadFile(path); err == nil {
		if tok := strings.TrimSpace(string(b)); len(tok) >= 16 {
			return tok, nil
		}
		return "", fmt.Errorf("reading the cluster token: %s holds no token", path)
	} else if !os.IsNotExist(err) || !generate {
		return "", fmt.Errorf("reading the cluster token (give --token or $%s): %w", ClusterTokenEnv, err)
	}
	tok := "aenvct_" + randomHex(24)
	if err := storeSecret(path, tok); err != nil {
		return "", fmt.Errorf("storing the cluster token: %w", err)
	}
	log.Info("generated a cluster token: nodes join with it", "path", path)
	return tok, nil
}
