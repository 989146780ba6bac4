package snapshot

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/store"
)

var ctx = context.Background()

func stage(t *testing.T, c *Catalog, id string, content string) {
	t.Helper()
	dir, err := c.Begin(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCatalogLifecycle(t *testing.T) {
	c, err := Open(t.TempDir(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	stage(t, c, "s1", "one")
	// Staged but not committed: invisible.
	if _, err := c.Get(ctx, "s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("staged snapshot visible: %v", err)
	}
	if err := c.Commit(ctx, &Snapshot{ID: "s1", Names: []string{"first"}, Kind: KindSnapshot}); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"s1", "first"} {
		s, err := c.Get(ctx, ref)
		if err != nil || s.ID != "s1" || s.SizeBytes != 3 || s.Dir == "" {
			t.Fatalf("Get(%q) = %+v, %v", ref, s, err)
		}
		if b, _ := os.ReadFile(filepath.Join(s.Dir, "checkpoint.img")); string(b) != "one" {
			t.Fatalf("image content %q", b)
		}
	}
	stage(t, c, "s2", "two")
	if err := c.Commit(ctx, &Snapshot{ID: "s2", Names: []string{"first"}, Kind: KindSnapshot}); err == nil {
		t.Fatal("a second snapshot took a taken name")
	}
	stage(t, c, "s3", "three")
	if err := c.Commit(ctx, &Snapshot{ID: "s3", Kind: KindPause}); err != nil {
		t.Fatal(err)
	}
	snaps, _ := c.List(ctx, KindSnapshot)
	pauses, _ := c.List(ctx, KindPause)
	if len(snaps) != 1 || snaps[0].ID != "s1" || len(pauses) != 1 || pauses[0].ID != "s3" {
		t.Fatalf("List by kind: %v %v", snaps, pauses)
	}
	if err := c.Delete(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "first"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted snapshot still resolves: %v", err)
	}
	if err := c.Delete(ctx, "s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	for _, bad := range []string{"../x", "", "A"} {
		if _, err := c.Begin(bad); err == nil {
			t.Fatalf("Begin(%q) accepted", bad)
		}
		if _, err := c.Get(ctx, bad); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get(%q) = %v", bad, err)
		}
	}
}

// TestCommitIsDurable: the image files are on the disk before the
// metadata that publishes them is written, and the directory before it is
// renamed into place; a failed flush publishes nothing.
func TestCommitIsDurable(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(dir, "s1"+partialSuffix)
	var mu sync.Mutex
	var synced []string
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	c.sync = func(path string) error {
		mu.Lock()
		defer mu.Unlock()
		rel, _ := filepath.Rel(dir, path)
		switch {
		case path == dir:
			if !exists(filepath.Join(dir, "s1", metaFile)) {
				t.Errorf("the catalog directory was synced before the rename")
			}
		case path == staging:
			if !exists(filepath.Join(staging, metaFile)) {
				t.Errorf("the staged snapshot was synced before its metadata was written")
			}
		default:
			if exists(filepath.Join(staging, metaFile)) {
				t.Errorf("%s was synced after the metadata was written", rel)
			}
		}
		synced = append(synced, rel)
		return nil
	}
	stage(t, c, "s1", "one")
	if err := os.WriteFile(filepath.Join(staging, "pages.img"), []byte("pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(ctx, &Snapshot{ID: "s1", Kind: KindPause}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(synced)
	want := []string{".", "s1.partial", "s1.partial/checkpoint.img", "s1.partial/pages.img"}
	if !slices.Equal(synced, want) {
		t.Fatalf("synced %q, want %q", synced, want)
	}

	// A flush that fails (a disk error) fails the commit: nothing is
	// published.
	c.sync = func(path string) error {
		if filepath.Base(path) == "pages.img" {
			return errors.New("input/output error")
		}
		return nil
	}
	stage(t, c, "s2", "two")
	if err := os.WriteFile(filepath.Join(dir, "s2"+partialSuffix, "pages.img"), []byte("pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Commit(ctx, &Snapshot{ID: "s2", Kind: KindPause}); err == nil || !strings.Contains(err.Error(), "input/output error") {
		t.Fatalf("a commit whose pages could not be flushed: %v", err)
	}
	if _, err := c.Get(ctx, "s2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a snapshot whose pages could not be flushed was published: %v", err)
	}

	// A fork's state is not waited for: only its metadata and the
	// directories are flushed.
	synced = nil
	c.sync = func(path string) error {
		mu.Lock()
		defer mu.Unlock()
		rel, _ := filepath.Rel(dir, path)
		synced = append(synced, rel)
		return nil
	}
	stage(t, c, "f1", "fork")
	if err := c.Commit(ctx, &Snapshot{ID: "f1", Kind: KindFork}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(synced)
	if want := []string{".", "f1.partial"}; !slices.Equal(synced, want) {
		t.Fatalf("a fork's commit synced %q, want %q", synced, want)
	}
	if _, err := c.Get(ctx, "f1"); err != nil {
		t.Fatalf("the fork's snapshot was not published: %v", err)
	}

	// A snapshot another node sent (a migration) is flushed whole, its
	// metadata too, before it is installed.
	other, err := Open(t.TempDir(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	stage(t, other, "s3", "three")
	if err := other.Commit(ctx, &Snapshot{ID: "s3", Kind: KindPause}); err != nil {
		t.Fatal(err)
	}
	in, err := c.Incoming("s3")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"checkpoint.img", metaFile} {
		b, err := os.ReadFile(filepath.Join(other.dir, "s3", name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(in, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	synced = nil
	if _, err := c.Install("s3", in); err != nil {
		t.Fatal(err)
	}
	slices.Sort(synced)
	inRel, _ := filepath.Rel(dir, in)
	want = []string{".", inRel, inRel + "/checkpoint.img", inRel + "/" + metaFile}
	if !slices.Equal(synced, want) {
		t.Fatalf("installing synced %q, want %q", synced, want)
	}
}

// TestCrashMidSaveKeepsPrevious simulates a process killed while writing a
// snapshot: the half-written one never appears and earlier ones are intact.
func TestCrashMidSaveKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	stage(t, c, "old", "intact")
	if err := c.Commit(ctx, &Snapshot{ID: "old", Kind: KindPause}); err != nil {
		t.Fatal(err)
	}
	stage(t, c, "new", "half-writ") // no Commit: the process "died"

	c2, err := Open(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new"+partialSuffix)); !os.IsNotExist(err) {
		t.Fatalf("partial snapshot survived reopening: %v", err)
	}
	all, _ := c2.List(ctx)
	if len(all) != 1 || all[0].ID != "old" {
		t.Fatalf("after crash: %v", all)
	}
	if b, _ := os.ReadFile(filepath.Join(all[0].Dir, "checkpoint.img")); string(b) != "intact" {
		t.Fatalf("previous snapshot damaged: %q", b)
	}
}

// TestRemoteStore keeps snapshots in a store on a (shared) directory: the
// catalog lists from it and fetches what this node lost.
func TestRemoteStore(t *testing.T) {
	backend, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	remote, err := store.New(store.Options{Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	dir := t.TempDir()
	c, err := Open(dir, remote, nil)
	if err != nil {
		t.Fatal(err)
	}
	stage(t, c, "r1", "remote-data")
	if err := c.Commit(ctx, &Snapshot{ID: "r1", Names: []string{"named"}, Kind: KindPause, TemplateID: "base"}); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Get(ctx, "r1"); err != nil {
		t.Fatalf("committed snapshot not in the store: %v", err)
	}

	// This node loses its copy (or another node asks): the catalog still
	// knows it, and Fetch brings the image back.
	if err := os.RemoveAll(filepath.Join(dir, "r1")); err != nil {
		t.Fatal(err)
	}
	c2, err := Open(dir, remote, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c2.Get(ctx, "named")
	if err != nil || s.ID != "r1" || s.Dir != "" || s.TemplateID != "base" {
		t.Fatalf("Get from the store = %+v, %v", s, err)
	}
	s, err = c2.Fetch(ctx, "named")
	if err != nil || s.Dir == "" {
		t.Fatalf("Fetch = %+v, %v", s, err)
	}
	if b, _ := os.ReadFile(filepath.Join(s.Dir, "checkpoint.img")); string(b) != "remote-data" {
		t.Fatalf("fetched image %q", b)
	}
	if all, _ := c2.List(ctx, KindPause); len(all) != 1 || all[0].Dir == "" {
		t.Fatalf("List = %v", all)
	}
	if err := c2.Delete(ctx, "r1"); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Get(ctx, "r1"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted snapshot still in the store: %v", err)
	}
	if _, err := c2.Get(ctx, "r1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted snapshot still listed: %v", err)
	}
}

// TestSealedMetadata: a snapshot's environment variables and envd token
// are nowhere in clear, neither in the local catalog nor in the store,
// and come back whole from both (another node's catalog with the same key
// fetching it).
func TestSealedMetadata(t *testing.T) {
	storeDir := t.TempDir()
	backend, err := store.NewLocal(storeDir)
	if err != nil {
		t.Fatal(err)
	}
	remote, err := store.New(store.Options{Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	keys, err := sealed.NewKeyring([]sealed.Key{sealed.NewKey()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c, err := Open(dir, remote, keys)
	if err != nil {
		t.Fatal(err)
	}
	stage(t, c, "p1", "memory")
	in := &Snapshot{ID: "p1", Kind: KindPause, EnvdAccessToken: "token-f00d", EnvVars: map[string]string{"SECRET": "value-beef"}}
	if err := c.Commit(ctx, in); err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{dir, storeDir} {
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, _ := os.ReadFile(p)
			if bytes.Contains(b, []byte("f00d")) || bytes.Contains(b, []byte("beef")) {
				t.Errorf("%s holds a secret in clear: %s", p, b)
			}
			return nil
		})
	}
	check := func(what string, s *Snapshot, err error) {
		t.Helper()
		if err != nil || s.EnvdAccessToken != "token-f00d" || s.EnvVars["SECRET"] != "value-beef" || s.SealedEnvVars != "" {
			t.Fatalf("%s: %+v %v", what, s, err)
		}
	}
	s, err := c.Get(ctx, "p1")
	check("local", s, err)
	other, err := Open(t.TempDir(), remote, keys)
	if err != nil {
		t.Fatal(err)
	}
	s, err = other.Fetch(ctx, "p1")
	check("fetched by another node", s, err)
	s, err = other.Get(ctx, "p1")
	check("read back where it was fetched", s, err)

	// A node with another cluster's key does not list it.
	wrong, _ := sealed.NewKeyring([]sealed.Key{sealed.NewKey()}, nil)
	stranger, err := Open(t.TempDir(), remote, wrong)
	if err != nil {
		t.Fatal(err)
	}
	if all, _ := stranger.List(ctx); len(all) != 0 {
		t.Fatalf("listed with another key: %+v", all)
	}
}
