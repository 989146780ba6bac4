// Package volume holds sandbox volumes on a node: one directory per
// volume under the node's volume directory, mounted read-write into the
// sandboxes that ask for it, and the data plane E2B's Volume class speaks
// (/volumecontent/{volumeID}/dir|path|file). Every path is resolved
// through os.Root, so no request (a "..", an absolute path, a symlink a
// sandbox planted) reaches outside its volume.
package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
)

// validID is what a volume id looks like (the cluster makes them).
var validID = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// ValidID reports whether id can name a volume.
func ValidID(id string) bool { return validID.MatchString(id) }

// ErrNotFound is returned for a volume this node does not hold.
var ErrNotFound = errors.New("volume not found")

// Dir is a node's volume directory.
type Dir struct {
	root string
}

// Open opens (creating) the volume directory root.
func Open(root string) (*Dir, error) {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("opening volume directory: %w", err)
	}
	return &Dir{root: root}, nil
}

// Path is where volume id's files are on the host.
func (d *Dir) Path(id string) (string, error) {
	if !ValidID(id) {
		return "", fmt.Errorf("volume %q: %w", id, ErrNotFound)
	}
	return filepath.Join(d.root, id), nil
}

// Create makes volume id's directory (owned by the sandboxes' default
// user, uid 1000, as E2B's volumes are); an existing one is kept.
func (d *Dir) Create(id string) (string, error) {
	p, err := d.Path(id)
	if err != nil {
		return "", err
	}
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	if err := os.Chown(p, 1000, 1000); err != nil {
		return "", fmt.Errorf("creating volume %s: %w", id, err)
	}
	return p, nil
}

// Delete removes volume id and its files.
func (d *Dir) Delete(id string) error {
	p, err := d.Path(id)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("deleting volume %s: %w", id, err)
	}
	return nil
}

// Exists reports whether this node holds volume id.
func (d *Dir) Exists(id string) bool {
	p, err := d.Path(id)
	if err != nil {
		return false
	}
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}
