package api

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/template"
)

// TestReleaseKeepsFilesAskedFor: a build's end leaves its uploads to a
// client that asked for them since it started, and to another build
// still using them; the last user's end removes them.
func TestReleaseKeepsFilesAskedFor(t *testing.T) {
	store, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	bs := New(Config{Templates: store, APIKey: "k", Builds: RefusingJobs(t)}).builds
	const key = "team/h1" // a team's upload of hash h1 (fileKey)
	dir := filepath.Join(bs.filesRoot(), key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, uploadDone)
	old := time.Now().Add(-time.Hour)
	os.WriteFile(marker, nil, 0o600)
	os.Chtimes(marker, old, old)
	gone := func() bool {
		_, err := os.Stat(dir)
		return errors.Is(err, os.ErrNotExist)
	}

	started := time.Now().Add(-time.Minute)
	if !bs.acquireFiles([]string{key}) {
		t.Fatal("acquiring uploaded files")
	}
	bs.touchFiles(key) // a client is told they are there
	bs.releaseFiles([]string{key}, started)
	if gone() {
		t.Fatal("a build's end removed files a client asked for since it started")
	}

	// Two builds: the first to end leaves them to the other.
	os.Chtimes(marker, old, old)
	bs.acquireFiles([]string{key})
	bs.acquireFiles([]string{key})
	bs.releaseFiles([]string{key}, time.Now())
	if gone() {
		t.Fatal("a build's end removed files another running build uses")
	}
	if n, _ := bs.s.SweepBuildFiles(time.Now().Add(48 * time.Hour)); n != 0 || gone() {
		t.Fatal("the sweep removed files a running build uses")
	}
	bs.releaseFiles([]string{key}, time.Now())
	if !gone() {
		t.Fatal("the last build's end kept its files")
	}
	if bs.acquireFiles([]string{key}) {
		t.Fatal("acquired files that are gone")
	}
}
