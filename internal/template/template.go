// Package template holds the templates a node can start sandboxes from: a
// root filesystem tree plus its default resources, kept under the node's
// data directory. It also builds the `base` template from Debian's packages,
// so that a host without a container registry still has one. The node and
// cluster packages import it.
package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"syscall"
	"time"
)

// BaseID is the template every E2B client expects to exist.
const BaseID = "base"

// ErrNotFound is returned for an unknown template id or alias.
var ErrNotFound = errors.New("template not found")

// validID is what a template id or alias may look like; anything else could
// walk out of the templates directory.
var validID = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// Template describes one template.
type Template struct {
	ID        string    `json:"templateID"`
	Aliases   []string  `json:"aliases,omitempty"`
	CPUCount  int       `json:"cpuCount"`
	MemoryMB  int       `json:"memoryMB"`
	DiskMB    int       `json:"diskSizeMB"`
	CreatedAt time.Time `json:"createdAt"`
	// PidsLimit is the processes and threads each user of its sandboxes
	// may run; 0 takes the server's setting.
	PidsLimit int `json:"pidsLimit,omitempty"`
	// SizeBytes is the disk space the root filesystem takes.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// StartCmd and ReadyCmd start the template's service and tell when it
	// is up (recorded by `aenv pull`; not run yet).
	StartCmd string `json:"startCmd,omitempty"`
	ReadyCmd string `json:"readyCmd,omitempty"`
	// Image is the configuration of the OCI image the template was pulled
	// from; nil for templates made otherwise.
	Image *ImageConfig `json:"image,omitempty"`
	// RootFS is the host directory of the root filesystem (not stored).
	RootFS string `json:"-"`
}

// Store is the set of templates under one directory. It is safe for
// concurrent use.
type Store struct {
	dir string
	// baseRootFS, when set, is a prebuilt tree used for `base` instead of
	// the one under dir.
	baseRootFS string

	mu sync.Mutex
	// baseSize and baseTime describe the base tree, measured once.
	baseSize int64
	baseTime time.Time
}

// StoreOptions configures a Store.
type StoreOptions struct {
	// Dir holds one sub-directory per template.
	Dir string
	// BaseRootFS optionally points `base` at a prebuilt root filesystem
	// shared by several data directories (tests, benchmarks).
	BaseRootFS string
}

// NewStore opens (creating if needed) the template directory.
func NewStore(opts StoreOptions) (*Store, error) {
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating template dir: %w", err)
	}
	return &Store{dir: opts.Dir, baseRootFS: opts.BaseRootFS}, nil
}

// Dir returns the directory the store keeps its templates in.
func (s *Store) Dir() string { return s.dir }

// ValidID reports whether s can name a template.
func ValidID(s string) bool { return validID.MatchString(s) }

// BaseRootFS returns where the base template's root filesystem is (or will
// be built).
func (s *Store) BaseRootFS() string {
	if s.baseRootFS != "" {
		return s.baseRootFS
	}
	return filepath.Join(s.dir, BaseID, "rootfs")
}

// Get returns the template with the given id or alias.
func (s *Store) Get(idOrAlias string) (*Template, error) {
	if !ValidID(idOrAlias) {
		return nil, fmt.Errorf("looking up template %q: %w", idOrAlias, ErrNotFound)
	}
	if idOrAlias == BaseID {
		return s.base()
	}
	// Most lookups name an id: read it directly before scanning aliases.
	if t, err := s.read(idOrAlias); err == nil {
		return t, nil
	}
	all, err := s.List()
	if err != nil {
		return nil, err
	}
	for _, t := range all {
		if t.ID == idOrAlias {
			return t, nil
		}
		for _, a := range t.Aliases {
			if a == idOrAlias {
				return t, nil
			}
		}
	}
	return nil, fmt.Errorf("looking up template %q: %w", idOrAlias, ErrNotFound)
}

func (s *Store) base() (*Template, error) {
	root := s.BaseRootFS()
	if _, err := os.Stat(filepath.Join(root, "bin", "bash")); err != nil {
		return nil, fmt.Errorf("looking up template %q: base root filesystem missing at %s: %w", BaseID, root, ErrNotFound)
	}
	t, err := s.read(BaseID)
	if err != nil {
		t = &Template{ID: BaseID, CPUCount: 2, MemoryMB: 512}
	}
	t.RootFS = root
	return t, nil
}

// describeBase fills in what the base template's record lacks: the tree
// is built in place, not committed, so it is measured here, once (not in
// base, which every create of base calls).
func (s *Store) describeBase(t *Template) {
	root := t.RootFS
	s.mu.Lock()
	if s.baseSize == 0 {
		s.baseSize, _ = diskUsage(root)
		if fi, err := os.Stat(filepath.Join(root, "bin")); err == nil {
			s.baseTime = fi.ModTime().UTC()
		}
	}
	if t.SizeBytes == 0 {
		t.SizeBytes = s.baseSize
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = s.baseTime
	}
	s.mu.Unlock()
}

// diskUsage is the space the files under root take on disk (allocated
// blocks, as du counts them; hard links once).
func diskUsage(root string) (int64, error) {
	var total int64
	seen := map[[2]uint64]bool{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if st.Nlink > 1 {
				key := [2]uint64{uint64(st.Dev), st.Ino}
				if seen[key] {
					return nil
				}
				seen[key] = true
			}
			total += st.Blocks * 512
			return nil
		}
		total += fi.Size()
		return nil
	})
	return total, err
}

func (s *Store) read(id string) (*Template, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, id, "template.json"))
	if err != nil {
		return nil, err
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("reading template %s: %w", id, err)
	}
	t.RootFS = filepath.Join(s.dir, id, "rootfs")
	return &t, nil
}

// List returns every template, base first.
func (s *Store) List() ([]*Template, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	var out []*Template
	if b, err := s.base(); err == nil {
		s.describeBase(b)
		out = append(out, b)
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == BaseID || !ValidID(e.Name()) {
			continue
		}
		t, err := s.read(e.Name())
		if err != nil {
			continue // half-written or foreign directory
		}
		out = append(out, t)
	}
	sort.SliceStable(out[min(1, len(out)):], func(i, j int) bool {
		rest := out[min(1, len(out)):]
		return rest[i].ID < rest[j].ID
	})
	return out, nil
}

// Put records t's metadata; its rootfs must already be in place.
func (s *Store) Put(t *Template) error {
	if !ValidID(t.ID) {
		return fmt.Errorf("storing template %q: invalid id", t.ID)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join(s.dir, t.ID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("storing template %s: %w", t.ID, err)
	}
	b, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "template.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("storing template %s: %w", t.ID, err)
	}
	return os.Rename(tmp, filepath.Join(dir, "template.json"))
}

// ErrProtected is returned when deleting a template that must exist.
var ErrProtected = errors.New("template cannot be deleted")

// Delete removes a template and its root filesystem. The base template
// cannot be deleted.
func (s *Store) Delete(idOrAlias string) error {
	t, err := s.Get(idOrAlias)
	if err != nil {
		return err
	}
	if t.ID == BaseID {
		return fmt.Errorf("deleting template %s: %w", t.ID, ErrProtected)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dir := filepath.Join(s.dir, t.ID)
	// Hide it first, so that a crash mid-removal leaves no broken template.
	tmp := filepath.Join(s.dir, "."+t.ID+".deleting")
	if err := os.Rename(dir, tmp); err != nil {
		return fmt.Errorf("deleting template %s: %w", t.ID, err)
	}
	return os.RemoveAll(tmp)
}
