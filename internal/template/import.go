package template

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ImageConfig is what a template keeps of the OCI image it was pulled from:
// where it came from, and the parts of the image's configuration that
// commands run in its sandboxes should honour.
type ImageConfig struct {
	// Ref is the reference the image was pulled by, as given.
	Ref string `json:"ref"`
	// Digest is the digest of the image manifest that was unpacked.
	Digest     string   `json:"digest,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// stagePrefix starts the names of directories where templates are being
// assembled. A template id cannot start with a dot, so Get and List never
// see them.
const stagePrefix = ".stage-"

// Stage is a template being assembled out of sight: a root filesystem
// directory on the store's filesystem that becomes the template only on
// Commit. Until then an existing template of the same id stays as it is;
// Abort (or a crash) leaves no trace of the new one. A Stage is not safe
// for concurrent use.
type Stage struct {
	store *Catalog
	id    string
	dir   string
	// lock is the stage directory, flock'ed for as long as the stage is
	// alive, so that NewStage in any process can tell abandoned stages
	// from ones still being written.
	lock *os.File
	done bool
}

// NewStage starts assembling template id. It first removes stages that
// their owners abandoned (a killed pull), in this process or another.
func (s *Catalog) NewStage(id string) (*Stage, error) {
	if !ValidID(id) {
		return nil, fmt.Errorf("staging template %q: invalid id (lower-case letters, digits, '.', '_' and '-', at most 63)", id)
	}
	var suffix [6]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, fmt.Errorf("staging template %s: %w", id, err)
	}
	dir := filepath.Join(s.dir, stagePrefix+id+"-"+hex.EncodeToString(suffix[:]))
	// A stage is unlocked between its mkdir and its lock: another
	// NewStage's sweep must not see it then (and remove it as abandoned),
	// as concurrent builds did.
	s.stageMu.Lock()
	s.removeAbandonedStages()
	err := os.Mkdir(dir, 0o700)
	var lock *os.File
	if err == nil {
		if lock, err = lockDir(dir); err != nil {
			os.RemoveAll(dir)
		}
	}
	s.stageMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("staging template %s: %w", id, err)
	}
	st := &Stage{store: s, id: id, dir: dir, lock: lock}
	for _, sub := range []string{st.RootFS(), st.ScratchDir()} {
		if err := os.Mkdir(sub, 0o755); err != nil {
			st.Abort()
			return nil, fmt.Errorf("staging template %s: %w", id, err)
		}
	}
	return st, nil
}

// ID returns the id the stage will be published as.
func (st *Stage) ID() string { return st.id }

// RootFS returns the directory to fill with the template's root
// filesystem.
func (st *Stage) RootFS() string { return filepath.Join(st.dir, "rootfs") }

// ScratchDir returns a directory on the same filesystem as RootFS for
// temporary files (downloads); Commit removes it.
func (st *Stage) ScratchDir() string { return filepath.Join(st.dir, "scratch") }

// Commit publishes the stage as template t (t.ID must be the stage's id):
// it writes t's metadata, flushes the filesystem, and swaps the stage in for
// any existing template of that id in one rename, so readers see the old
// template or the new one, never a mix. The previous template's files are
// then deleted. Sandboxes still running from them lose their root
// filesystem's unread files.
func (st *Stage) Commit(t *Template) error {
	if st.done {
		return fmt.Errorf("committing template %s: stage already finished", st.id)
	}
	if t.ID != st.id {
		return fmt.Errorf("committing template %s: metadata names %q", st.id, t.ID)
	}
	if err := os.RemoveAll(st.ScratchDir()); err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	rec := *t
	if rec.CreatedAt.IsZero() {
		rec.CreatedAt = time.Now().UTC()
	}
	size, err := diskUsage(st.RootFS())
	if err != nil {
		return fmt.Errorf("committing template %s: measuring it: %w", st.id, err)
	}
	rec.SizeBytes = size
	if err := st.buildImage(&rec); err != nil {
		return err
	}
	b, err := json.MarshalIndent(&rec, "", "  ")
	if err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	if err := os.WriteFile(filepath.Join(st.dir, "template.json"), b, 0o644); err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	// The stage was private (0700) while it was written.
	if err := os.Chmod(st.dir, 0o755); err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	// Data first, name second: after a crash the template is either absent
	// or complete, never a tree of empty files.
	if err := syncFS(st.lock); err != nil {
		return fmt.Errorf("committing template %s: flushing: %w", st.id, err)
	}
	target := filepath.Join(st.store.dir, st.id)
	st.store.mu.Lock()
	replaced, err := swapDir(st.dir, target)
	st.store.mu.Unlock()
	if err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	st.done = true
	// st.dir now holds the previous template, if there was one. Should
	// deleting it fail, the next NewStage sweeps it.
	if replaced {
		_ = os.RemoveAll(st.dir)
	}
	st.lock.Close()
	// Complete here; the cluster's other hosts see it once it is in the
	// store.
	return st.store.publish(&rec)
}

// Abort deletes the stage. It is a no-op after Commit or Abort, so it can
// be deferred.
func (st *Stage) Abort() error {
	if st.done {
		return nil
	}
	st.done = true
	err := os.RemoveAll(st.dir)
	st.lock.Close()
	if err != nil {
		return fmt.Errorf("removing staged template %s: %w", st.id, err)
	}
	return nil
}

// removeAbandonedStages deletes stage directories nobody holds a lock on:
// left by a process that died mid-pull, or old templates a Commit could not
// delete. Failures are ignored; the next call tries again.
func (s *Catalog) removeAbandonedStages() {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), stagePrefix) {
			continue
		}
		p := filepath.Join(s.dir, e.Name())
		f, err := lockDir(p)
		if err != nil {
			continue // alive, or gone already
		}
		os.RemoveAll(p)
		f.Close()
	}
}

// errLocked means another stage owner holds the lock.
var errLocked = errors.New("stage is in use")
