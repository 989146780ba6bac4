// Package template holds the templates a node can start sandboxes from: a
// root filesystem tree plus its default resources, kept under the node's
// data directory. It also builds the `base` template from Debian's packages,
// so that a host without a container registry still has one. The node's
// side (node, nodeserver, agent), builds and pulls import it, and the API
// lists, looks up and deletes templates with it: it links no block-device
// code (a node's catalog makes block images with package template/erofs,
// see BlockImages). The cluster never imports it.
package template

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/aenvhq/aenv/internal/store"
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
	ID      string   `json:"templateID"`
	Aliases []string `json:"aliases,omitempty"`
	// Team owns the template and Name is what the team calls it (its id
	// is the name qualified by the team: two teams may each have a
	// template of a name). Templates from before teams, base and the
	// builtins have neither: every team sees them.
	Team      string    `json:"team,omitempty"`
	Name      string    `json:"name,omitempty"`
	CPUCount  int       `json:"cpuCount"`
	MemoryMB  int       `json:"memoryMB"`
	DiskMB    int       `json:"diskSizeMB"`
	CreatedAt time.Time `json:"createdAt"`
	// PidsLimit is the processes and threads each user of its sandboxes
	// may run; 0 takes the server's setting.
	PidsLimit int `json:"pidsLimit,omitempty"`
	// SizeBytes is the disk space the root filesystem takes.
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// StartCmd starts the template's service and ReadyCmd succeeds once
	// it is up. A node runs them once per template, in a sandbox it then
	// snapshots, and starts the template's sandboxes from that snapshot,
	// so that they start with the service up.
	StartCmd string `json:"startCmd,omitempty"`
	ReadyCmd string `json:"readyCmd,omitempty"`
	// Tools are node binaries (next to envd) its sandboxes get at
	// /.aenv/<name>: services that must match the node, not the tree.
	Tools []string `json:"tools,omitempty"`
	// Image is the configuration of the OCI image the template was pulled
	// from; nil for templates made otherwise.
	Image *ImageConfig `json:"image,omitempty"`
	// BlockImage names the template's root filesystem as one block image
	// (erofs), by its content: the manifest in the store it is served
	// from, on demand, on nodes that lack the tree. A new version of the
	// template is a new image, so that sandboxes started from the old
	// one keep their files. Empty for templates without one (base, the
	// builtins, hosts without mkfs.erofs).
	BlockImage string `json:"blockImage,omitempty"`
	// ImageBytes is the block image's size.
	ImageBytes int64 `json:"imageBytes,omitempty"`
	// RootFS is the host directory of the root filesystem (not stored).
	RootFS string `json:"-"`
	// ImageFile is the host path of the block image, when this host has
	// it whole (not stored).
	ImageFile string `json:"-"`
	// BaseImage is, for base run from its tree's image (ImageFile), the
	// id that image has in the store (BaseImageID). Base has no
	// BlockImage: every host builds and serves its own tree. But a
	// snapshot names the image it was saved on, and another host, whose
	// own base image differs, restores it from the store, where
	// PublishBaseImage puts it (not stored).
	BaseImage string `json:"-"`
	// Remote marks a template known only from the remote store: its files
	// are not on this host (Fetch brings them).
	Remote bool `json:"-"`
}

// Catalog is the set of templates under one directory. It is safe for
// concurrent use.
type Catalog struct {
	dir string
	// baseRootFS, when set, is a prebuilt tree used for `base` instead of
	// the one under dir.
	baseRootFS string
	// baseImage is CatalogOptions.BaseImage.
	baseImage bool
	// builtins are templates over prebuilt trees of this host.
	builtins []*Template

	// remote, when set, is the store templates are published to and
	// fetched from.
	remote *store.Repository
	// images is remote cut finer, for block images (see CatalogOptions).
	images *store.Repository
	// blocks makes and reads block images; nil on the control plane.
	blocks   BlockImages
	fetching singleflight.Group
	log      *slog.Logger

	usage usageCache

	// stageMu orders the creation of stages with the sweep of abandoned
	// ones (NewStage).
	stageMu sync.Mutex

	mu sync.Mutex
	// baseIDs memoizes BaseImageID by the image's path, size and time:
	// base is looked up on every create of it.
	baseIDs map[baseImageKey]string
	// baseSize and baseTime describe the base tree, measured once.
	baseMeasured bool
	baseSize     int64
	baseTime     time.Time
}

// CatalogOptions configures a Catalog.
type CatalogOptions struct {
	// Dir holds one sub-directory per template.
	Dir string
	// BaseRootFS optionally points `base` at a prebuilt root filesystem
	// shared by several data directories (tests, benchmarks).
	BaseRootFS string
	// BaseImage gives `base` its tree's EROFS image (BaseImageFile) as
	// its ImageFile when a fresh one is there, and names it (BaseImage).
	// Every host builds base itself, so two hosts' images differ, and a
	// sandbox run from one host's image restores only from that image
	// (gVisor checks its superblock): another host fetches it from
	// Images, which PublishBaseImage fills.
	BaseImage bool
	// Builtins are templates over trees this host already has (prebuilt
	// caches, such as the code-interpreter one), each with RootFS set:
	// found and listed like this host's own, never published (every host
	// of a cluster brings its own).
	Builtins []*Template
	// Remote, when set, is the store the cluster's nodes share: templates
	// put here are published there, and those there are listed (and
	// fetched by Fetch) here too.
	Remote *store.Repository
	// Images is the store block images are published to: Remote's
	// backend, cut into smaller chunks than snapshots (a read on demand
	// then fetches less). Default: Remote.
	Images *store.Repository
	// Blocks makes the block images of the templates committed here and
	// reads those fetched (the node side's: package template/erofs);
	// nil keeps templates as trees, which the control plane, which only
	// lists, looks up and deletes them, never makes.
	Blocks BlockImages
	Logger *slog.Logger
}

// NewCatalog opens (creating if needed) the template directory.
func NewCatalog(opts CatalogOptions) (*Catalog, error) {
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating template dir: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Images == nil {
		opts.Images = opts.Remote
	}
	return &Catalog{dir: opts.Dir, baseRootFS: opts.BaseRootFS, baseImage: opts.BaseImage, builtins: opts.Builtins, remote: opts.Remote, images: opts.Images, blocks: opts.Blocks, log: opts.Logger}, nil
}

// remoteTimeout bounds a look at the remote store's catalog.
const remoteTimeout = 30 * time.Second

// Dir returns the directory the store keeps its templates in.
func (s *Catalog) Dir() string { return s.dir }

// ValidID reports whether s can name a template.
func ValidID(s string) bool { return validID.MatchString(s) }

// BaseRootFS returns where the base template's root filesystem is (or will
// be built).
func (s *Catalog) BaseRootFS() string {
	if s.baseRootFS != "" {
		return s.baseRootFS
	}
	return filepath.Join(s.dir, BaseID, "rootfs")
}

// Get returns the template with the given id or alias: this host's, else
// (with a remote store) the description of one published there, marked
// Remote.
func (s *Catalog) Get(idOrAlias string) (*Template, error) {
	t, err := s.GetLocal(idOrAlias)
	// base is every host's own, never published.
	if !errors.Is(err, ErrNotFound) || s.remote == nil || idOrAlias == BaseID {
		return t, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	return s.remoteGet(ctx, idOrAlias)
}

// GetLocal returns the template with the given id or alias if its files
// are on this host.
func (s *Catalog) GetLocal(idOrAlias string) (*Template, error) {
	if !ValidID(idOrAlias) {
		return nil, fmt.Errorf("looking up template %q: %w", idOrAlias, ErrNotFound)
	}
	if idOrAlias == BaseID {
		return s.base()
	}
	if t := s.builtin(idOrAlias); t != nil {
		return t, nil
	}
	// Most lookups name an id: read it directly before scanning aliases.
	if t, err := s.read(idOrAlias); err == nil {
		return t, nil
	}
	all, err := s.ListLocal()
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

// builtin returns a copy of the builtin template named idOrAlias, or nil.
func (s *Catalog) builtin(idOrAlias string) *Template {
	for _, t := range s.builtins {
		if t.ID == idOrAlias || slices.Contains(t.Aliases, idOrAlias) {
			c := *t
			return &c
		}
	}
	return nil
}

func (s *Catalog) base() (*Template, error) {
	root := s.BaseRootFS()
	if _, err := os.Stat(filepath.Join(root, "bin", "bash")); err != nil {
		return nil, fmt.Errorf("looking up template %q: base root filesystem missing at %s: %w", BaseID, root, ErrNotFound)
	}
	t, err := s.read(BaseID)
	if err != nil {
		t = &Template{ID: BaseID, CPUCount: 2, MemoryMB: 512}
	}
	t.RootFS = root
	if s.baseImage {
		t.ImageFile = FreshBaseImage(root)
	}
	if t.ImageFile != "" {
		if t.BaseImage, err = s.baseImageID(t.ImageFile); err != nil {
			// Without an id a snapshot could not say which image it needs:
			// the sandboxes run with a gofer instead.
			s.log.Warn("base sandboxes run with a gofer: reading the base template's image", "err", err)
			t.ImageFile = ""
		}
	}
	return t, nil
}

// Stored says whether the catalog has a store beyond this host, where
// block images are published and read.
func (s *Catalog) Stored() bool { return s.images != nil }

// RootImage is the block image t's sandboxes run on, which their
// snapshots name: its BlockImage, or base's image (BaseImage).
func (t *Template) RootImage() string { return cmp.Or(t.BlockImage, t.BaseImage) }

// baseImageKey tells one base image file from its rebuilds.
type baseImageKey struct {
	path  string
	size  int64
	mtime time.Time
}

// baseImageID is BaseImageID(file), memoized.
func (s *Catalog) baseImageID(file string) (string, error) {
	fi, err := os.Stat(file)
	if err != nil {
		return "", err
	}
	key := baseImageKey{file, fi.Size(), fi.ModTime()}
	s.mu.Lock()
	id, ok := s.baseIDs[key]
	s.mu.Unlock()
	if ok {
		return id, nil
	}
	if id, err = BaseImageID(file); err != nil {
		return "", err
	}
	s.mu.Lock()
	if s.baseIDs == nil {
		s.baseIDs = map[baseImageKey]string{}
	}
	s.baseIDs[key] = id
	s.mu.Unlock()
	return id, nil
}

// BaseImageID names base's image at file in the store by a digest of its
// EROFS superblock (its UUID, build time and checksum). Hashing the whole
// 200 MB, as a template's image is named, would cost every server start a
// second of CPU for the same answer: no two builds share a superblock.
// It is read here rather than with blockimage.Identity, which the gVisor
// driver checks restores by: the control plane links this package, and
// must not link block images' FUSE and mounts.
func BaseImageID(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("naming the base template's image: %w", err)
	}
	defer f.Close()
	sb := make([]byte, 128)
	if _, err := f.ReadAt(sb, 1024); err != nil {
		return "", fmt.Errorf("naming the base template's image %s: reading its superblock: %w", file, err)
	}
	sum := sha256.Sum256(sb)
	return ImagePrefix + "base-" + hex.EncodeToString(sum[:16]), nil
}

// PublishBaseImage puts base's image, id (its BaseImage), into the store
// unless it is there: a snapshot of a sandbox run on it names it, and
// another host restores the snapshot from it. The first publish of an
// image reads and uploads its ~200 MB; later ones find it there, at the
// cost of a look (not remembered here: the store's collector deletes an
// image no sandbox or snapshot has used for a while). Without a store no
// other host can reach the snapshot: nothing to do.
func (s *Catalog) PublishBaseImage(ctx context.Context, id string) error {
	if s.images == nil {
		return nil
	}
	_, err, _ := s.fetching.Do("publish "+id, func() (any, error) {
		if err := s.publishBaseImage(ctx, id); err != nil {
			return nil, fmt.Errorf("publishing the base template's image %s: %w", id, err)
		}
		return nil, nil
	})
	return err
}

// publishBaseImage is PublishBaseImage's work.
func (s *Catalog) publishBaseImage(ctx context.Context, id string) error {
	t, err := s.base()
	if err != nil {
		return err
	}
	if t.BaseImage != id {
		// Not this host's base: a sandbox restored here from another
		// host's snapshot runs on that host's image, from the store.
		if _, err := s.images.Get(ctx, id); err != nil {
			return fmt.Errorf("this host's base runs on %q (rebuilt?), and the store lacks it: %w", t.BaseImage, err)
		}
		return nil
	}
	start := time.Now()
	_, st, err := s.images.Save(ctx, id, "", map[string]string{ImageManifestFile: t.ImageFile}, nil)
	if errors.Is(err, store.ErrExists) {
		return nil
	}
	if err != nil {
		return err
	}
	s.log.Info("base template's image published, for its snapshots to restore on other hosts", "image", id,
		"chunks", st.ChunksTotal, "chunks_uploaded", st.ChunksUploaded, "bytes_uploaded", st.BytesUploaded,
		"took_ms", time.Since(start).Milliseconds())
	return nil
}

// BaseImageFile is where the base template's tree at root is kept as an
// EROFS image too (package template/erofs makes it): beside the tree,
// which has no block image of its own (base is every host's own, built
// in place; only its image goes to the store, for snapshots of its
// sandboxes: PublishBaseImage).
func BaseImageFile(root string) string { return root + ".erofs" }

// FreshBaseImage returns BaseImageFile(root) when it exists and is newer
// than the tree's /bin (a tree rebuilt in place leaves it stale), else "".
func FreshBaseImage(root string) string {
	img, err := os.Stat(BaseImageFile(root))
	if err != nil || !img.Mode().IsRegular() {
		return ""
	}
	tree, err := os.Stat(filepath.Join(root, "bin"))
	if err != nil || img.ModTime().Before(tree.ModTime()) {
		return ""
	}
	return BaseImageFile(root)
}

// describeBase fills in what the base template's record lacks: the tree
// is built in place, not committed, so it is measured here, once (not in
// base, which every create of base calls).
func (s *Catalog) describeBase(t *Template) {
	root := t.RootFS
	s.mu.Lock()
	if !s.baseMeasured {
		s.baseMeasured = true
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

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
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

func (s *Catalog) read(id string) (*Template, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, id, "template.json"))
	if err != nil {
		return nil, err
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("reading template %s: %w", id, err)
	}
	t.RootFS = filepath.Join(s.dir, id, "rootfs")
	if t.BlockImage != "" {
		if p := filepath.Join(s.dir, id, imageFile); fileExists(p) {
			t.ImageFile = p
		}
	}
	return &t, nil
}

// List returns every template, base first: this host's and, with a remote
// store, those published there (marked Remote).
func (s *Catalog) List() ([]*Template, error) {
	out, err := s.ListLocal()
	if err == nil && len(out) > 0 && out[0].ID == BaseID {
		// Measured for listings only: the node's reports and lookups call
		// ListLocal too.
		s.describeBase(out[0])
	}
	if err != nil || s.remote == nil {
		return out, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
	defer cancel()
	remote, err := s.remoteTemplates(ctx)
	if err != nil {
		s.log.Warn("listing the store's templates", "err", err)
	}
	have := map[string]bool{}
	for _, t := range out {
		have[t.ID] = true
	}
	for _, t := range remote {
		if !have[t.ID] {
			out = append(out, t)
		}
	}
	sortTemplates(out)
	return out, nil
}

// sortTemplates orders templates base first, then by id.
func sortTemplates(out []*Template) {
	sort.SliceStable(out[min(1, len(out)):], func(i, j int) bool {
		rest := out[min(1, len(out)):]
		return rest[i].ID < rest[j].ID
	})
}

// ListLocal returns the templates whose files are on this host, base
// first.
func (s *Catalog) ListLocal() ([]*Template, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing templates: %w", err)
	}
	var out []*Template
	if b, err := s.base(); err == nil {
		out = append(out, b)
	}
	for _, b := range s.builtins {
		c := *b
		out = append(out, &c)
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == BaseID || !ValidID(e.Name()) || s.builtin(e.Name()) != nil {
			continue
		}
		t, err := s.read(e.Name())
		if err != nil {
			continue // half-written or foreign directory
		}
		out = append(out, t)
	}
	sortTemplates(out)
	return out, nil
}

// Put records t's metadata; its rootfs must already be in place. With a
// remote store the template is then published there, and Put answers once
// it is durable.
func (s *Catalog) Put(t *Template) error {
	if err := s.putLocal(t); err != nil {
		return err
	}
	// The template is complete here; the cluster sees it once it is in
	// the store.
	return s.publish(t)
}

func (s *Catalog) putLocal(t *Template) error {
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
func (s *Catalog) Delete(idOrAlias string) error {
	t, err := s.Get(idOrAlias)
	if err != nil {
		return err
	}
	if t.ID == BaseID || s.builtin(t.ID) != nil {
		return fmt.Errorf("deleting template %s: %w", t.ID, ErrProtected)
	}
	if s.remote != nil {
		ctx, cancel := context.WithTimeout(context.Background(), remoteTimeout)
		err := s.remote.Delete(ctx, remoteID(t.ID))
		cancel()
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("deleting template %s from the store: %w", t.ID, err)
		}
	}
	if t.Remote {
		return nil
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
