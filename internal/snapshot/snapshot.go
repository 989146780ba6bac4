// Package snapshot keeps the node's catalog of saved sandbox states: the
// runtime's checkpoint image plus what is needed to start sandboxes from it
// again (template, resources, envd token). A snapshot is staged in a
// partial directory and becomes visible only once it is complete (and,
// with a remote store, once all its data is stored there), so a crash or a
// full disk in the middle never leaves a half snapshot in the catalog nor
// touches earlier ones. The local directory is a cache of the remote
// store: a snapshot missing locally is fetched from it. The node package
// imports it.
package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/store"
)

// ErrNotFound is returned for an unknown snapshot id or name.
var ErrNotFound = errors.New("snapshot not found")

// Kind says what a snapshot is for.
type Kind string

// Kinds of snapshots.
const (
	// KindSnapshot is one a user asked for; it is listed and can be used as
	// a template.
	KindSnapshot Kind = "snapshot"
	// KindPause holds a paused sandbox; resuming consumes it.
	KindPause Kind = "pause"
	// KindFork is the transient state children of a fork start from.
	KindFork Kind = "fork"
	// KindTemplate is a template's service started and ready: the node
	// starts the template's sandboxes from it.
	KindTemplate Kind = "template"
)

var validID = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidID reports whether s can name a snapshot.
func ValidID(s string) bool { return validID.MatchString(s) }

// Snapshot describes one saved state.
type Snapshot struct {
	ID    string   `json:"snapshotID"`
	Names []string `json:"names"`
	Kind  Kind     `json:"kind"`
	// SandboxID is the sandbox the state was saved from.
	SandboxID string `json:"sandboxID"`
	// TemplateID is the template whose root filesystem the state runs on.
	TemplateID string `json:"templateID"`
	// RootImage is the block image the state's root filesystem was on
	// (empty: the template's directory).
	RootImage       string    `json:"rootImage,omitempty"`
	CPUCount        int       `json:"cpuCount"`
	MemoryMB        int       `json:"memoryMB"`
	DiskMB          int       `json:"diskSizeMB"`
	EnvdVersion     string    `json:"envdVersion"`
	EnvdAccessToken string    `json:"envdAccessToken,omitempty"`
	CreatedAt       time.Time `json:"createdAt"`
	SizeBytes       int64     `json:"sizeBytes"`
	// Runtime and RuntimeVersion name the driver that saved the state: a
	// saved sandbox restores only where both match.
	Runtime        string `json:"runtime,omitempty"`
	RuntimeVersion string `json:"runtimeVersion,omitempty"`
	// WritableMB is the size of the disk-backed writable layer the state
	// was saved with; 0 (snapshots from before disks) is a memory layer.
	// A restore must use the same.
	WritableMB int `json:"writableMB,omitempty"`
	// Mounts are the volumes the sandbox had mounted: a restore mounts
	// them again (on the node that holds them).
	Mounts []Mount `json:"mounts,omitempty"`
	// FilesOnly marks a snapshot of the sandbox's files without its
	// memory (FilesFile, a tar of its writes): restoring it boots the
	// template afresh with those files, and EnvVars, as at its create.
	FilesOnly bool              `json:"filesOnly,omitempty"`
	EnvVars   map[string]string `json:"envVars,omitempty"`
	// SealedEnvVars is EnvVars as stored: JSON sealed with the data key
	// (EnvVars is then not stored).
	SealedEnvVars string `json:"sealedEnvVars,omitempty"`
	// Dir holds the runtime's image (not stored).
	Dir string `json:"-"`
}

// Catalog is the snapshots under one directory, optionally backed by a
// durable store shared by every node. It is safe for concurrent use.
type Catalog struct {
	dir    string
	remote *store.Repository
	// keys seal the environment variables and the envd token in the
	// metadata (nil: stored in clear).
	keys *sealed.Keyring
	// sync flushes a file or directory to the disk (syncPath; tests
	// watch it).
	sync func(path string) error
	// writeBack starts the writeback of a file's dirty pages without
	// waiting for it (startWriteback; tests watch it).
	writeBack func(f *os.File) error
	mu        sync.Mutex
}

const partialSuffix = ".partial"

// Open opens (creating if needed) the catalog in dir and removes what an
// interrupted save left behind. With remote, snapshots are also written to
// (and, when missing here, read from) that store. keys seal the secrets in
// the metadata.
func Open(dir string, remote *store.Repository, keys *sealed.Keyring) (*Catalog, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("opening snapshot catalog: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("opening snapshot catalog: %w", err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), partialSuffix) {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
	return &Catalog{dir: dir, remote: remote, keys: keys, sync: syncPath, writeBack: startWriteback}, nil
}

// Begin returns an empty staging directory for snapshot id's image.
func (c *Catalog) Begin(id string) (string, error) {
	if !ValidID(id) {
		return "", fmt.Errorf("staging snapshot %q: invalid id", id)
	}
	dir := filepath.Join(c.dir, id+partialSuffix)
	if err := os.RemoveAll(dir); err != nil {
		return "", fmt.Errorf("staging snapshot %s: %w", id, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("staging snapshot %s: %w", id, err)
	}
	return dir, nil
}

// Abort discards a staged snapshot.
func (c *Catalog) Abort(id string) {
	os.RemoveAll(filepath.Join(c.dir, id+partialSuffix))
}

// Commit publishes the staged snapshot s.ID with s's metadata: the
// metadata is synced into the staging dir, the files go to the remote
// store (if any; only chunks it lacks are uploaded), and the staging dir is
// then renamed into place in one step.
func (c *Catalog) Commit(ctx context.Context, s *Snapshot) error {
	staging := filepath.Join(c.dir, s.ID+partialSuffix)
	size, err := dirSize(staging)
	if err != nil {
		return fmt.Errorf("committing snapshot %s: %w", s.ID, err)
	}
	s.SizeBytes = size
	if s.CreatedAt.IsZero() {
		s.CreatedAt = time.Now().UTC()
	}
	b, err := c.encode(s)
	if err != nil {
		return fmt.Errorf("committing snapshot %s: %w", s.ID, err)
	}
	c.mu.Lock()
	for _, n := range s.Names {
		if other, err := c.getLocked(ctx, n, false); err == nil && other.ID != s.ID {
			c.mu.Unlock()
			return fmt.Errorf("committing snapshot %s: name %q is taken by %s", s.ID, n, other.ID)
		}
	}
	c.mu.Unlock()
	files, err := imageFiles(staging)
	if err != nil {
		return fmt.Errorf("committing snapshot %s: %w", s.ID, err)
	}
	if c.remote != nil {
		if _, _, err := c.remote.Save(ctx, s.ID, "", files, b); err != nil {
			return fmt.Errorf("committing snapshot %s: %w", s.ID, err)
		}
	}
	if err := c.publish(staging, s.ID, files, b, s.durable()); err != nil {
		return fmt.Errorf("committing snapshot %s: %w", s.ID, err)
	}
	s.Dir = filepath.Join(c.dir, s.ID)
	return nil
}

// durable says whether Commit waits for s's image to reach the disk. A
// fork's state lives for the seconds its children take to start, and a
// restart drops what a crash left of it (metadata that parses and pages
// that may not): its pages are not waited for. Flushing them took 0.6 s
// of a 256 MiB fork's 0.8 s snapshot here.
func (s *Snapshot) durable() bool { return s.Kind != KindFork }

// publish makes the image files in staging durable (unless not
// flushImages), then writes their metadata beside them (nil: it is there
// already, and flushed with them) and renames staging into place, durably
// too. The runtime writes the images through the page cache: a crash
// after a publish that did not wait for them could leave a snapshot whose
// metadata is on disk but whose pages are not (a new file's blocks are
// written back seconds later), and the sandbox it paused is gone by then.
func (c *Catalog) publish(staging, id string, files map[string]string, meta []byte, flushImages bool) error {
	flush := map[string]string{}
	if flushImages {
		maps.Copy(flush, files)
	}
	if meta == nil {
		flush[metaFile] = filepath.Join(staging, metaFile)
	}
	if err := c.syncFiles(flush); err != nil {
		return err
	}
	if meta != nil {
		if err := writeSynced(filepath.Join(staging, metaFile), meta); err != nil {
			return err
		}
	}
	if err := c.sync(staging); err != nil {
		return err
	}
	if err := os.Rename(staging, filepath.Join(c.dir, id)); err != nil {
		return err
	}
	// The rename is done: failing now would report a snapshot as not
	// taken while it is in place. A failed sync of the directory only
	// leaves the rename to the next writeback.
	_ = c.sync(c.dir)
	return nil
}

// syncFiles flushes each of files to the disk, all at once: each waits
// for its own writeback, which the disk serves side by side.
func (c *Catalog) syncFiles(files map[string]string) error {
	errs := make(chan error, len(files))
	for _, path := range files {
		go func() { errs <- c.sync(path) }()
	}
	var all []error
	for range files {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

// syncPath flushes the file or directory at path to the disk.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return nil
}

const metaFile = "meta.json"

// imageFiles maps the names of the runtime's image files in dir to their
// paths.
func imageFiles(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	files := map[string]string{}
	for _, e := range entries {
		if e.Type().IsRegular() && e.Name() != metaFile {
			files[e.Name()] = filepath.Join(dir, e.Name())
		}
	}
	return files, nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func dirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	return total, err
}

// Get describes the snapshot with the given id or name. Its Dir is empty
// when only the remote store has its image; Fetch brings it here.
func (c *Catalog) Get(ctx context.Context, idOrName string) (*Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.getLocked(ctx, idOrName, false)
}

// Fetch is Get, fetching the image from the remote store when this node
// does not have it, so that the snapshot can be restored here.
func (c *Catalog) Fetch(ctx context.Context, idOrName string) (*Snapshot, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.getLocked(ctx, idOrName, true)
}

func (c *Catalog) getLocked(ctx context.Context, idOrName string, fetch bool) (*Snapshot, error) {
	if !ValidID(idOrName) {
		return nil, fmt.Errorf("looking up snapshot %q: %w", idOrName, ErrNotFound)
	}
	if s, err := c.read(idOrName); err == nil {
		return s, nil
	}
	all, err := c.listLocked(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range all {
		if s.ID != idOrName && !slices.Contains(s.Names, idOrName) {
			continue
		}
		if s.Dir != "" || !fetch {
			return s, nil
		}
		return c.fetchLocked(ctx, s)
	}
	return nil, fmt.Errorf("looking up snapshot %q: %w", idOrName, ErrNotFound)
}

// fetchLocked brings a snapshot known only to the remote store into the
// local directory.
func (c *Catalog) fetchLocked(ctx context.Context, s *Snapshot) (*Snapshot, error) {
	staging := filepath.Join(c.dir, s.ID+partialSuffix)
	os.RemoveAll(staging)
	if err := c.remote.Restore(ctx, s.ID, staging); err != nil {
		os.RemoveAll(staging)
		return nil, fmt.Errorf("fetching snapshot %s: %w", s.ID, err)
	}
	b, err := c.encode(s)
	if err != nil {
		os.RemoveAll(staging)
		return nil, fmt.Errorf("fetching snapshot %s: %w", s.ID, err)
	}
	// A local copy is published as durably as a committed one: after a
	// crash a torn copy would be restored instead of fetched again.
	files, err := imageFiles(staging)
	if err == nil {
		err = c.publish(staging, s.ID, files, b, true)
	}
	if err != nil {
		os.RemoveAll(staging)
		return nil, fmt.Errorf("fetching snapshot %s: %w", s.ID, err)
	}
	out := *s
	out.Dir = filepath.Join(c.dir, s.ID)
	return &out, nil
}

func (c *Catalog) read(id string) (*Snapshot, error) {
	dir := filepath.Join(c.dir, id)
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, err
	}
	s, err := c.decode(b)
	if err != nil {
		return nil, fmt.Errorf("reading snapshot %s: %w", id, err)
	}
	s.Dir = dir
	return s, nil
}

// encode is s's metadata as stored, its secrets sealed, each bound to the
// snapshot and field.
func (c *Catalog) encode(s *Snapshot) ([]byte, error) {
	out := *s
	out.EnvdAccessToken = c.keys.Seal(s.EnvdAccessToken, "snapshots/"+s.ID+"/envdAccessToken")
	if len(s.EnvVars) > 0 && c.keys != nil {
		env, err := json.Marshal(s.EnvVars)
		if err != nil {
			return nil, err
		}
		out.EnvVars, out.SealedEnvVars = nil, c.keys.Seal(string(env), "snapshots/"+s.ID+"/envVars")
	}
	return json.MarshalIndent(&out, "", "  ")
}

// decode reads metadata encode wrote (or, from before sealing, in clear).
func (c *Catalog) decode(b []byte) (*Snapshot, error) {
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, err
	}
	var err error
	if s.EnvdAccessToken, err = c.keys.Open(s.EnvdAccessToken, "snapshots/"+s.ID+"/envdAccessToken"); err != nil {
		return nil, fmt.Errorf("its envd token: %w", err)
	}
	if s.SealedEnvVars != "" {
		env, err := c.keys.Open(s.SealedEnvVars, "snapshots/"+s.ID+"/envVars")
		if err != nil {
			return nil, fmt.Errorf("its environment variables: %w", err)
		}
		if err := json.Unmarshal([]byte(env), &s.EnvVars); err != nil {
			return nil, fmt.Errorf("its environment variables: %w", err)
		}
		s.SealedEnvVars = ""
	}
	return &s, nil
}

// List returns the snapshots of the given kinds (all when none), oldest
// first. With a remote store, that store is the catalog; snapshots this
// node has locally carry their Dir.
func (c *Catalog) List(ctx context.Context, kinds ...Kind) ([]*Snapshot, error) {
	c.mu.Lock()
	all, err := c.listLocked(ctx)
	c.mu.Unlock()
	if err != nil || len(kinds) == 0 {
		return all, err
	}
	var out []*Snapshot
	for _, s := range all {
		if slices.Contains(kinds, s.Kind) {
			out = append(out, s)
		}
	}
	return out, nil
}

func (c *Catalog) listLocked(ctx context.Context) ([]*Snapshot, error) {
	var out []*Snapshot
	if c.remote != nil {
		manifests, err := c.remote.List(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing snapshots: %w", err)
		}
		for _, m := range manifests {
			s, err := c.decode(m.Meta)
			if err != nil || s.ID != m.ID {
				continue // not one of ours, or not for this cluster's key
			}
			if local, err := c.read(s.ID); err == nil {
				s.Dir = local.Dir
			}
			out = append(out, s)
		}
	} else {
		entries, err := os.ReadDir(c.dir)
		if err != nil {
			return nil, fmt.Errorf("listing snapshots: %w", err)
		}
		for _, e := range entries {
			if !e.IsDir() || strings.HasSuffix(e.Name(), partialSuffix) {
				continue
			}
			if s, err := c.read(e.Name()); err == nil {
				out = append(out, s)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Delete removes a snapshot, here and in the remote store.
func (c *Catalog) Delete(ctx context.Context, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !ValidID(id) {
		return fmt.Errorf("deleting snapshot %q: %w", id, ErrNotFound)
	}
	_, localErr := c.read(id)
	found := localErr == nil
	if c.remote != nil {
		err := c.remote.Delete(ctx, id)
		switch {
		case err == nil:
			found = true
		case !errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("deleting snapshot %s: %w", id, err)
		}
	}
	if !found {
		return fmt.Errorf("deleting snapshot %q: %w", id, ErrNotFound)
	}
	if localErr == nil {
		// Rename first so that a crash mid-removal cannot leave a snapshot
		// that looks complete but is not.
		tmp := filepath.Join(c.dir, id+".deleting"+partialSuffix)
		if err := os.Rename(filepath.Join(c.dir, id), tmp); err != nil {
			return fmt.Errorf("deleting snapshot %s: %w", id, err)
		}
		return os.RemoveAll(tmp)
	}
	return nil
}

// FilesFile is the tar of a FilesOnly snapshot.
const FilesFile = "files.tar"

// Mount is a volume mounted into a sandbox.
type Mount struct {
	VolumeID string `json:"volumeID"`
	Path     string `json:"path"`
}

// incomingSuffix marks the directory of a snapshot arriving from another
// node (a partial one: Open removes it).
const incomingSuffix = ".incoming" + partialSuffix

// incomingMaxAge is how long the files of a transfer that nobody goes on
// with are kept (for a resume after a cut) before Incoming drops them.
const incomingMaxAge = time.Hour

// Incoming returns the directory where snapshot id's files arrive from
// another node, keeping what an earlier, cut transfer left there. The
// leftovers of transfers abandoned for an hour are removed.
func (c *Catalog) Incoming(id string) (string, error) {
	if !ValidID(id) {
		return "", fmt.Errorf("receiving snapshot %q: invalid id", id)
	}
	if entries, err := os.ReadDir(c.dir); err == nil {
		for _, e := range entries {
			if info, err := e.Info(); err == nil && strings.HasSuffix(e.Name(), incomingSuffix) && time.Since(info.ModTime()) > incomingMaxAge {
				os.RemoveAll(filepath.Join(c.dir, e.Name()))
			}
		}
	}
	dir, err := c.IncomingDir(id)
	if err != nil {
		return "", err
	}
	now := time.Now()
	os.Chtimes(dir, now, now) // in use: not abandoned
	return dir, nil
}

// IncomingDir is Incoming without the sweep: for each chunk of a
// transfer under way.
func (c *Catalog) IncomingDir(id string) (string, error) {
	if !ValidID(id) {
		return "", fmt.Errorf("receiving snapshot %q: invalid id", id)
	}
	dir := filepath.Join(c.dir, id+incomingSuffix)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("receiving snapshot %s: %w", id, err)
	}
	return dir, nil
}

// DropIncoming removes what arrived of snapshot id.
func (c *Catalog) DropIncoming(id string) {
	if ValidID(id) {
		os.RemoveAll(filepath.Join(c.dir, id+incomingSuffix))
	}
}

// Install puts snapshot id, whose files (the runtime's image and its
// metadata, as another node's catalog keeps them) are in dir, in place in
// one rename. dir must be on the catalog's filesystem (under Incoming's).
// A snapshot this catalog has already is kept, and dir removed.
func (c *Catalog) Install(id, dir string) (*Snapshot, error) {
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		return nil, fmt.Errorf("installing snapshot %s: %w", id, err)
	}
	s, err := c.decode(b)
	if err != nil {
		return nil, fmt.Errorf("installing snapshot %s: its metadata: %w", id, err)
	}
	if s.ID != id {
		return nil, fmt.Errorf("installing snapshot %s: its metadata names %q", id, s.ID)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if local, err := c.read(id); err == nil {
		os.RemoveAll(dir)
		return local, nil
	}
	files, err := imageFiles(dir)
	if err == nil {
		err = c.publish(dir, id, files, nil, true)
	}
	if err != nil {
		return nil, fmt.Errorf("installing snapshot %s: %w", id, err)
	}
	s.Dir = filepath.Join(c.dir, id)
	return s, nil
}
