package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// CAKey holds the cluster's CA: its certificate, and its key sealed with
// the data key, so that every server of the cluster (they all hold the
// data key) signs with the same CA, and a reader of the state without
// the data key cannot.
const CAKey = "cluster/ca"

type caRecord struct {
	Cert string `json:"cert"`
	// Key is the CA's key in PEM, sealed (sealed.Keyring.Seal, with
	// CAKey as the associated data).
	Key string `json:"key"`
}

// SecretsDir is where a host keeps its secrets under its data directory.
func SecretsDir(dataDir string) string { return filepath.Join(dataDir, "secrets") }

// CAFiles are a server's CA files: <data-dir>/secrets/ca.crt and ca.key
// (mode 0600).
func CAFiles(dataDir string) pki.Files { return pki.Files{Dir: SecretsDir(dataDir), Name: "server"} }

// ErrWrongCA: this server's CA files are not the cluster's CA.
var ErrWrongCA = errors.New("wrong cluster CA")

// LoadCA is the cluster's CA for a server: the one in the state (stored
// in the data directory too, for the operator), else the one in the data
// directory, else a new one; either of the last two is recorded in the
// state for the other servers, the first server's winning a race. A
// server whose files hold another CA than the state's is refused
// (ErrWrongCA).
func LoadCA(ctx context.Context, st state.Store, keys *sealed.Keyring, dataDir string, log *slog.Logger) (*pki.CA, error) {
	files := CAFiles(dataDir)
	local, err := ReadCAFiles(files)
	if err != nil {
		return nil, err
	}
	for range 3 {
		e, err := st.Get(ctx, CAKey)
		if err == nil {
			ca, err := openCA(keys, e.Value)
			if err != nil {
				return nil, err
			}
			if local != nil && local.Hash() != ca.Hash() {
				return nil, fmt.Errorf("%w: %s holds CA %s, the cluster's is %s; remove this server's ca.crt and ca.key to take the cluster's",
					ErrWrongCA, files.Dir, local.Hash(), ca.Hash())
			}
			if local == nil {
				if err := storeCAFiles(files, ca); err != nil {
					return nil, err
				}
			}
			return ca, nil
		}
		if !errors.Is(err, state.ErrNotFound) {
			return nil, fmt.Errorf("reading the cluster CA: %w", err)
		}
		ca := local
		if ca == nil {
			if ca, err = pki.NewCA(time.Now()); err != nil {
				return nil, err
			}
		}
		rec, _ := json.Marshal(caRecord{Cert: string(ca.CertPEM()), Key: keys.Seal(string(ca.KeyPEM()), CAKey)})
		if _, err := st.Create(ctx, CAKey, rec, state.WriteOptions{}); errors.Is(err, state.ErrExists) {
			continue // another server's came first
		} else if err != nil {
			return nil, fmt.Errorf("recording the cluster CA: %w", err)
		}
		if local == nil {
			if err := storeCAFiles(files, ca); err != nil {
				return nil, err
			}
			log.Info("created the cluster's certificate authority", "path", files.CAPath(), "ca_hash", ca.Hash())
		}
		return ca, nil
	}
	return nil, errors.New("loading the cluster CA: the record keeps changing")
}

// ReadCAFiles reads the CA in files (nil, and no error, when neither
// file exists).
func ReadCAFiles(files pki.Files) (*pki.CA, error) {
	certPEM, errC := os.ReadFile(files.CAPath())
	keyPEM, errK := os.ReadFile(files.CAKeyPath())
	switch {
	case errC == nil && errK == nil:
		ca, err := pki.ParseCA(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("loading the cluster CA from %s: %w", files.Dir, err)
		}
		return ca, nil
	case errors.Is(errC, os.ErrNotExist) && errors.Is(errK, os.ErrNotExist):
		return nil, nil
	}
	return nil, fmt.Errorf("loading the cluster CA from %s: %w", files.Dir, errors.Join(errC, errK))
}

// BootstrapCA is the cluster's CA before the state can be read: etcd
// serves TLS with certificates of it, and the CA's record is in etcd. It
// is the one in files; when there is none and create is set (the first
// start of a server whose embedded etcd has no data yet), a new one,
// stored in files, which LoadCA records in the state once etcd serves.
func BootstrapCA(files pki.Files, create bool, log *slog.Logger) (*pki.CA, error) {
	ca, err := ReadCAFiles(files)
	if err != nil || ca != nil {
		return ca, err
	}
	if !create {
		return nil, fmt.Errorf("no cluster CA in %s: etcd serves TLS with certificates of the cluster's CA; copy ca.crt and ca.key there from a server of the cluster (<data-dir>/secrets)", files.Dir)
	}
	if ca, err = pki.NewCA(time.Now()); err != nil {
		return nil, err
	}
	if err := storeCAFiles(files, ca); err != nil {
		return nil, err
	}
	log.Info("created the cluster's certificate authority", "path", files.CAPath(), "ca_hash", ca.Hash())
	return ca, nil
}

func openCA(keys *sealed.Keyring, value []byte) (*pki.CA, error) {
	var rec caRecord
	if err := json.Unmarshal(value, &rec); err != nil {
		return nil, fmt.Errorf("reading the cluster CA: %w", err)
	}
	keyPEM, err := keys.Open(rec.Key, CAKey)
	if err != nil {
		return nil, fmt.Errorf("opening the cluster CA's key (is this server's data key the cluster's?): %w", err)
	}
	return pki.ParseCA([]byte(rec.Cert), []byte(keyPEM))
}

func storeCAFiles(files pki.Files, ca *pki.CA) error {
	if err := pki.WriteSecret(files.CAKeyPath(), ca.KeyPEM()); err != nil {
		return err
	}
	return pki.WriteSecret(files.CAPath(), ca.CertPEM())
}

// ResealCA is the CA record's value (at CAKey) opened with any of keys
// and sealed again with their current key, for a data key rotation.
func ResealCA(keys *sealed.Keyring, value []byte) ([]byte, error) {
	var rec caRecord
	if err := json.Unmarshal(value, &rec); err != nil {
		return nil, fmt.Errorf("reading the cluster CA: %w", err)
	}
	keyPEM, err := keys.Open(rec.Key, CAKey)
	if err != nil {
		return nil, fmt.Errorf("opening the cluster CA's key: %w", err)
	}
	rec.Key = keys.Seal(keyPEM, CAKey)
	return json.Marshal(rec)
}

// StoreCAFiles writes the CA of certPEM and keyPEM (a server's join
// answer) to files, after checking they are one CA.
func StoreCAFiles(files pki.Files, certPEM, keyPEM []byte) (*pki.CA, error) {
	ca, err := pki.ParseCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("storing the cluster CA in %s: %w", files.Dir, err)
	}
	if err := storeCAFiles(files, ca); err != nil {
		return nil, fmt.Errorf("storing the cluster CA in %s: %w", files.Dir, err)
	}
	return ca, nil
}
