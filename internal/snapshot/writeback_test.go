package snapshot

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestWritebackDuringSave checks that the files of a snapshot Commit
// flushes are handed to the disk while they are being written, each file
// as it appears, and no longer once stopped; a fork's are left alone.
func TestWritebackDuringSave(t *testing.T) {
	dir := t.TempDir()
	c, err := Open(dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	started := map[string]int{}
	c.writeBack = func(f *os.File) error {
		mu.Lock()
		defer mu.Unlock()
		started[filepath.Base(f.Name())]++
		return nil
	}
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return started[name]
	}
	waitFor := func(name string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for count(name) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s was not written back while the save went on", name)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	staging, err := c.Begin("s1")
	if err != nil {
		t.Fatal(err)
	}
	stop := c.StartWriteback(&Snapshot{ID: "s1", Kind: KindPause})
	if err := os.WriteFile(filepath.Join(staging, "pages.img"), []byte("pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor("pages.img")
	// A file the save writes later is found too.
	if err := os.WriteFile(filepath.Join(staging, "checkpoint.img"), []byte("state"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor("checkpoint.img")
	stop()
	after := count("pages.img")
	time.Sleep(5 * writebackEvery)
	if n := count("pages.img"); n != after {
		t.Errorf("written back %d more times after stop", n-after)
	}
	stop() // a second stop is harmless
	if err := c.Commit(ctx, &Snapshot{ID: "s1", Kind: KindPause}); err != nil {
		t.Fatal(err)
	}

	// A fork's pages are not flushed, so not written back either.
	forkDir, err := c.Begin("f1")
	if err != nil {
		t.Fatal(err)
	}
	stop = c.StartWriteback(&Snapshot{ID: "f1", Kind: KindFork})
	if err := os.WriteFile(filepath.Join(forkDir, "fork-pages.img"), []byte("pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * writebackEvery)
	stop()
	if n := count("fork-pages.img"); n != 0 {
		t.Errorf("a fork's file was written back %d times", n)
	}
}

// TestStartWriteback runs the real call on a file with dirty pages.
func TestStartWriteback(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "pages.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	if err := startWriteback(f); err != nil {
		t.Fatalf("starting the writeback of a file with dirty pages: %v", err)
	}
}
