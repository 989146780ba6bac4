package membership

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/aenvhq/aenv/internal/state"
)

// tokenKey holds a hash of the cluster token: every server and node must
// hold the token itself.
const tokenKey = "cluster/token-sha256"

// ErrWrongToken: the cluster token given is not the cluster's.
var ErrWrongToken = errors.New("wrong cluster token")

// CheckToken makes sure token is the cluster's. The first server to come
// (adopt) records it; after that, a process whose token differs is
// refused (ErrWrongToken).
func CheckToken(ctx context.Context, st state.Store, token string, adopt bool) error {
	sum := sha256.Sum256([]byte(token))
	want := hex.EncodeToString(sum[:])
	e, err := st.Get(ctx, tokenKey)
	if errors.Is(err, state.ErrNotFound) && adopt {
		if _, err := st.Create(ctx, tokenKey, []byte(want), state.WriteOptions{}); err == nil {
			return nil
		} else if !errors.Is(err, state.ErrExists) {
			return fmt.Errorf("recording the cluster token: %w", err)
		}
		e, err = st.Get(ctx, tokenKey)
	}
	if errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("%w: the cluster has no token yet (start a server first)", ErrWrongToken)
	}
	if err != nil {
		return fmt.Errorf("checking the cluster token: %w", err)
	}
	if subtle.ConstantTimeCompare(e.Value, []byte(want)) != 1 {
		return fmt.Errorf("%w: it does not match the token the cluster was set up with", ErrWrongToken)
	}
	return nil
}

// ClusterTokenPath is where a server keeps the cluster token under its
// data directory.
func ClusterTokenPath(dataDir string) string {
	return filepath.Join(dataDir, "secrets", "cluster-token")
}

// ClusterTokenEnv overrides the stored cluster token.
const ClusterTokenEnv = "AENV_CLUSTER_TOKEN"

// LoadClusterToken returns the token servers and nodes authenticate each
// other with: the override, else $AENV_CLUSTER_TOKEN, else the stored
// one, else (generate true: a server) a new one it stores.
func LoadClusterToken(dataDir, override string, generate bool, log *slog.Logger) (string, error) {
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
	tok := "aenvct_" + RandomHex(24)
	if err := StoreSecret(path, tok); err != nil {
		return "", fmt.Errorf("storing the cluster token: %w", err)
	}
	log.Info("generated a cluster token: nodes join with it", "path", path)
	return tok, nil
}
