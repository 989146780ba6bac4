package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// DataKeyPath is where a server keeps the cluster's data key (the keys
// that seal secrets at rest, the sealing one first) under its data
// directory.
func DataKeyPath(dataDir string) string { return filepath.Join(dataDir, "secrets", "data-key") }

// DataKeyEnv carries the data keys themselves, overriding any file.
const DataKeyEnv = "AENV_DATA_KEY"

// dataKeySource says where the data keys came from, for the errors that
// tell an operator what to fix.
type dataKeySource struct {
	keys *sealed.Keyring
	// where names the source ("$AENV_DATA_KEY", a path, "the join").
	where string
	// generated: this start made the key (and its file).
	generated bool
}

// loadDataKeys returns the data keys: $AENV_DATA_KEY, else the file
// (default DataKeyPath), else (generate: a server) a new key it stores
// (mode 0600). A node agent without any gets none here (keys nil): the
// join hands it the cluster's. Keys from a file are read again when a
// value names a key they lack, so that a rotation reaches running
// processes through the file.
func loadDataKeys(dataDir, file string, generate bool, log *slog.Logger) (dataKeySource, error) {
	if text := os.Getenv(DataKeyEnv); text != "" {
		keys, err := sealed.ParseKeys(text)
		if err != nil {
			return dataKeySource{}, fmt.Errorf("reading the data key from $%s: %w", DataKeyEnv, err)
		}
		kr, err := sealed.NewKeyring(keys, nil)
		return dataKeySource{keys: kr, where: "$" + DataKeyEnv}, err
	}
	explicit := file != ""
	if !explicit {
		file = DataKeyPath(dataDir)
	}
	read := func() ([]sealed.Key, error) {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		return sealed.ParseKeys(string(b))
	}
	keys, err := read()
	switch {
	case err == nil:
		kr, err := sealed.NewKeyring(keys, read)
		return dataKeySource{keys: kr, where: file}, err
	case !errors.Is(err, os.ErrNotExist) || explicit:
		return dataKeySource{}, fmt.Errorf("reading the data key %s: %w", file, err)
	case !generate:
		return dataKeySource{}, nil
	}
	k := sealed.NewKey()
	if err := storeSecret(file, k.String()); err != nil {
		return dataKeySource{}, fmt.Errorf("storing the data key: %w", err)
	}
	log.Info("generated the cluster's data key: it seals tokens and environment variables at rest; other servers and node agents need it", "path", file, "key_id", k.ID)
	kr, err := sealed.NewKeyring([]sealed.Key{k}, read)
	return dataKeySource{keys: kr, where: file, generated: true}, err
}

// checkDataKeys makes sure src holds the cluster's key (a server adopts
// its own when the cluster has none). A key this start generated for a
// cluster that already has one is removed again: the operator copies the
// cluster's instead.
func checkDataKeys(ctx context.Context, st state.Store, src dataKeySource, adopt bool) error {
	err := cluster.CheckDataKey(ctx, st, src.keys, adopt)
	if err == nil {
		return nil
	}
	if src.generated {
		os.Remove(src.where)
	}
	if errors.Is(err, cluster.ErrWrongDataKey) {
		return fmt.Errorf("the data key from %s: %w; copy %s from a server of the cluster (or set $%s, or give --data-key-file)",
			src.where, err, "<data-dir>/secrets/data-key", DataKeyEnv)
	}
	return err
}
