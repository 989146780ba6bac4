package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// DataKeyCheckKey holds a value sealed with the cluster's data key: a
// process whose keys do not open it holds another cluster's key, and would
// write records nobody else can read.
const DataKeyCheckKey = "cluster/data-key-check"

const dataKeyCheckText = "aenv data key"

// ErrWrongDataKey: the data key given is not the cluster's.
var ErrWrongDataKey = errors.New("wrong data key")

// CheckDataKey makes sure keys open what the cluster seals. The first
// server to come (adopt) records its key; after that, a process whose keys
// lack the one in use is refused (ErrWrongDataKey).
func CheckDataKey(ctx context.Context, st state.Store, keys *sealed.Keyring, adopt bool) error {
	e, err := st.Get(ctx, DataKeyCheckKey)
	if errors.Is(err, state.ErrNotFound) && adopt {
		v := keys.Seal(dataKeyCheckText, DataKeyCheckKey)
		if _, err := st.Create(ctx, DataKeyCheckKey, []byte(v), state.WriteOptions{}); err == nil {
			return nil
		} else if !errors.Is(err, state.ErrExists) {
			return fmt.Errorf("recording the data key: %w", err)
		}
		e, err = st.Get(ctx, DataKeyCheckKey)
	}
	if errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("%w: the cluster has no data key yet (start a server first)", ErrWrongDataKey)
	}
	if err != nil {
		return fmt.Errorf("checking the data key: %w", err)
	}
	if got, err := keys.Open(string(e.Value), DataKeyCheckKey); err != nil || got != dataKeyCheckText {
		return fmt.Errorf("%w: the cluster's values are sealed with key %s, and this process holds %v (%v)",
			ErrWrongDataKey, sealed.KeyOf(string(e.Value)), keys.IDs(), err)
	}
	return nil
}

// ResealDataKeyCheck is the data key check's value (at DataKeyCheckKey)
// opened with any of keys and sealed again with their current key, for
// a rotation (cluster.ResealState).
func ResealDataKeyCheck(keys *sealed.Keyring, value []byte) ([]byte, error) {
	if got, err := keys.Open(string(value), DataKeyCheckKey); err != nil || got != dataKeyCheckText {
		return nil, fmt.Errorf("%w: %v", ErrWrongDataKey, err)
	}
	return []byte(keys.Seal(dataKeyCheckText, DataKeyCheckKey)), nil
}

// DataKeyPath is where a server keeps the cluster's data key (the keys
// that seal secrets at rest, the sealing one first) under its data
// directory.
func DataKeyPath(dataDir string) string { return filepath.Join(dataDir, "secrets", "data-key") }

// DataKeyEnv carries the data keys themselves, overriding any file.
const DataKeyEnv = "AENV_DATA_KEY"

// DataKeySource is the data keys a process holds and where they came
// from, for the errors that tell an operator what to fix.
type DataKeySource struct {
	Keys *sealed.Keyring
	// Where names the source ("$AENV_DATA_KEY", a path, "the join").
	Where string
	// Generated: this start made the key (and its file).
	Generated bool
}

// LoadDataKeys returns the data keys: $AENV_DATA_KEY, else the file
// (default DataKeyPath), else (generate: a server) a new key it stores
// (mode 0600). A node agent without any gets none here (keys nil): the
// join hands it the cluster's. Keys from a file are read again when a
// value names a key they lack, so that a rotation reaches running
// processes through the file.
func LoadDataKeys(dataDir, file string, generate bool, log *slog.Logger) (DataKeySource, error) {
	if text := os.Getenv(DataKeyEnv); text != "" {
		keys, err := sealed.ParseKeys(text)
		if err != nil {
			return DataKeySource{}, fmt.Errorf("reading the data key from $%s: %w", DataKeyEnv, err)
		}
		kr, err := sealed.NewKeyring(keys, nil)
		return DataKeySource{Keys: kr, Where: "$" + DataKeyEnv}, err
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
		return DataKeySource{Keys: kr, Where: file}, err
	case !errors.Is(err, os.ErrNotExist) || explicit:
		return DataKeySource{}, fmt.Errorf("reading the data key %s: %w", file, err)
	case !generate:
		return DataKeySource{}, nil
	}
	k := sealed.NewKey()
	if err := StoreSecret(file, k.String()); err != nil {
		return DataKeySource{}, fmt.Errorf("storing the data key: %w", err)
	}
	log.Info("generated the cluster's data key: it seals tokens and environment variables at rest; other servers and node agents need it", "path", file, "key_id", k.ID)
	kr, err := sealed.NewKeyring([]sealed.Key{k}, read)
	return DataKeySource{Keys: kr, Where: file, Generated: true}, err
}

// CheckDataKeys makes sure src holds the cluster's key (a server adopts
// its own when the cluster has none). A key this start generated for a
// cluster that already has one is removed again: the operator copies the
// cluster's instead.
func CheckDataKeys(ctx context.Context, st state.Store, src DataKeySource, adopt bool) error {
	err := CheckDataKey(ctx, st, src.Keys, adopt)
	if err == nil {
		return nil
	}
	if src.Generated {
		os.Remove(src.Where)
	}
	if errors.Is(err, ErrWrongDataKey) {
		return fmt.Errorf("the data key from %s: %w; copy %s from a server of the cluster (or set $%s, or give --data-key-file)",
			src.Where, err, "<data-dir>/secrets/data-key", DataKeyEnv)
	}
	return err
}
