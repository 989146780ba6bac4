package snapshot

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

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
	c, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	stage(t, c, "s1", "one")
	// Staged but not committed: invisible.
	if _, err := c.Get("s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("staged snapshot visible: %v", err)
	}
	if err := c.Commit(&Snapshot{ID: "s1", Names: []string{"first"}, Kind: KindSnapshot}); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{"s1", "first"} {
		s, err := c.Get(ref)
		if err != nil || s.ID != "s1" || s.SizeBytes != 3 || s.Dir == "" {
			t.Fatalf("Get(%q) = %+v, %v", ref, s, err)
		}
		if b, _ := os.ReadFile(filepath.Join(s.Dir, "checkpoint.img")); string(b) != "one" {
			t.Fatalf("image content %q", b)
		}
	}
	stage(t, c, "s2", "two")
	if err := c.Commit(&Snapshot{ID: "s2", Names: []string{"first"}, Kind: KindSnapshot}); err == nil {
		t.Fatal("a second snapshot took a taken name")
	}
	stage(t, c, "s3", "three")
	if err := c.Commit(&Snapshot{ID: "s3", Kind: KindPause}); err != nil {
		t.Fatal(err)
	}
	snaps, _ := c.List(KindSnapshot)
	pauses, _ := c.List(KindPause)
	if len(snaps) != 1 || snaps[0].ID != "s1" || len(pauses) != 1 || pauses[0].ID != "s3" {
		t.Fatalf("List by kind: %v %v", snaps, pauses)
	}
	if err := c.Delete("s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("first"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted snapshot still resolves: %v", err)
	}
	if err := c.Delete("s1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	for _, bad := range []string{"../x", "", "A"} {
		if _, err := c.Begin(bad); err == nil {
			t.Fatalf("Begin(%q) accepted", bad)
		}
		if _, err := c.Get(bad); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get(%q) = %v", bad, err)
		}
	}
}

// TestCrashMidSaveKeepsPrevious simulates a process killed while writing a
// snapshot: the half-written one never appears and earlier ones are intact.
func TestCrashMidSaveKeepsPrevious(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	stage(t, c, "old", "intact")
	if err := c.Commit(&Snapshot{ID: "old", Kind: KindPause}); err != nil {
		t.Fatal(err)
	}
	stage(t, c, "new", "half-writ") // no Commit: the process "died"

	c2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new"+partialSuffix)); !os.IsNotExist(err) {
		t.Fatalf("partial snapshot survived reopening: %v", err)
	}
	all, _ := c2.List()
	if len(all) != 1 || all[0].ID != "old" {
		t.Fatalf("after crash: %v", all)
	}
	if b, _ := os.ReadFile(filepath.Join(all[0].Dir, "checkpoint.img")); string(b) != "intact" {
		t.Fatalf("previous snapshot damaged: %q", b)
	}
}
