package store

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestLazyFile reads a stored file on demand, on the local backend and on
// the real S3 server: reads return the bytes saved, fetch only the chunks
// they touch, and a cache smaller than the file keeps to its bound while
// the whole file reads back twice identical. A corrupted chunk fails its
// reads; it never returns wrong bytes.
func TestLazyFile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		backend func(t *testing.T) Backend
	}{
		{"local", func(t *testing.T) Backend { return newLocalBackend(t) }},
		{"s3", func(t *testing.T) Backend { return newS3Backend(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			b := tc.backend(t)
			cacheDir := t.TempDir()
			s := newStore(t, Options{Backend: b, ChunkSize: MiB, CacheDir: cacheDir, CacheMaxBytes: 3 * MiB})
			data := randomBytes(7, 10*MiB+12345)
			if _, _, err := s.Save(ctx, "img-1", "", writeFiles(t, map[string][]byte{"disk.img": data}), nil); err != nil {
				t.Fatal(err)
			}
			// A fresh store, as a node that has never seen the image.
			cold := newStore(t, Options{Backend: b, ChunkSize: MiB, CacheDir: t.TempDir(), CacheMaxBytes: 3 * MiB})
			f, err := cold.OpenLazy(ctx, "img-1", "disk.img")
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Size() != int64(len(data)) {
				t.Fatalf("size %d, want %d", f.Size(), len(data))
			}
			buf := make([]byte, 4096)
			if _, err := f.ReadAt(buf, 5*MiB-100); err != nil || !bytes.Equal(buf, data[5*MiB-100:5*MiB-100+4096]) {
				t.Fatalf("a read across two chunks: %v", err)
			}
			if got := f.Fetched.Load(); got < 2 || got > 3 {
				t.Fatalf("a read of 4 KiB fetched %d chunks, want the 2 it spans (and 1 read ahead)", got)
			}
			// Many readers at once: each chunk is fetched once.
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p := make([]byte, 1000)
					off := int64(7*MiB + i)
					if _, err := f.ReadAt(p, off); err != nil || !bytes.Equal(p, data[off:off+1000]) {
						t.Errorf("concurrent read: %v", err)
					}
				}()
			}
			wg.Wait()
			if got := f.Fetched.Load(); got > 5 {
				t.Fatalf("8 concurrent reads of one chunk fetched %d chunks in all, want at most 5 (each once, with read-ahead)", got)
			}
			for round := range 2 {
				got, err := io.ReadAll(io.NewSectionReader(f, 0, f.Size()))
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("whole file, round %d: %v", round, err)
				}
				if size := dirBytes(t, cold.cache.dir); size > 3*MiB {
					t.Fatalf("the cache holds %d bytes, past its bound of %d", size, 3*MiB)
				}
			}
			if _, err := f.ReadAt(buf, f.Size()); err != io.EOF {
				t.Fatalf("a read at the end: %v, want EOF", err)
			}

			// Corrupt one chunk in the backend; a store without a cache
			// must notice it.
			ref := f.chunks[3]
			if err := b.Put(ctx, chunkKey(ref.Hash), bytes.NewReader(append([]byte{codecRaw}, bytes.Repeat([]byte{1}, int(ref.Size))...)), ref.Size+1); err != nil {
				t.Fatal(err)
			}
			bare := newStore(t, Options{Backend: b, ChunkSize: MiB})
			g, err := bare.OpenLazy(ctx, "img-1", "disk.img")
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			if _, err := g.ReadAt(buf, f.offsets[3]+10); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("a read of a corrupted chunk: %v, want ErrCorrupt", err)
			}
			if _, err := g.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, data[:4096]) {
				t.Fatalf("a good chunk after a bad one: %v", err)
			}
			if _, err := cold.OpenLazy(ctx, "img-1", "nope"); !errors.Is(err, ErrNoFile) {
				t.Fatalf("a missing file: %v", err)
			}
		})
	}
}

func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}

// TestLazyPrefetch records what one node's reads needed and prefetches it
// on another: the same reads there fetch nothing more.
func TestLazyPrefetch(t *testing.T) {
	ctx := context.Background()
	b := newLocalBackend(t)
	s := newStore(t, Options{Backend: b, ChunkSize: MiB})
	data := randomBytes(11, 8*MiB)
	if _, _, err := s.Save(ctx, "img-p", "", writeFiles(t, map[string][]byte{"disk.img": data}), nil); err != nil {
		t.Fatal(err)
	}
	reads := []int64{6*MiB + 5, 10, 3 * MiB}
	first := newStore(t, Options{Backend: b, ChunkSize: MiB, CacheDir: t.TempDir()})
	f, err := first.OpenLazy(ctx, "img-p", "disk.img")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 100)
	for _, off := range reads {
		if _, err := f.ReadAt(buf, off); err != nil {
			t.Fatal(err)
		}
	}
	trace := f.Trace()
	if len(trace) != 3 || trace[0] != 6 || trace[1] != 0 || trace[2] != 3 {
		t.Fatalf("trace %v, want [6 0 3]", trace)
	}
	second := newStore(t, Options{Backend: b, ChunkSize: MiB, CacheDir: t.TempDir()})
	g, err := second.OpenLazy(ctx, "img-p", "disk.img")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Prefetch(ctx, append(trace, 999)); err != nil {
		t.Fatal(err)
	}
	if got := g.Fetched.Load(); got != 3 {
		t.Fatalf("prefetch fetched %d chunks, want 3", got)
	}
	// Bypass the in-memory chunks: a new LazyFile over the same cache.
	// Counts are read once its reads ahead are done (Close).
	h, _ := second.OpenLazy(ctx, "img-p", "disk.img")
	for _, off := range reads {
		if _, err := h.ReadAt(buf, off); err != nil || !bytes.Equal(buf, data[off:off+100]) {
			t.Fatalf("read at %d after prefetch: %v", off, err)
		}
	}
	h.Close()
	// Only the reads ahead of the next chunks (not in the trace) may go
	// to the store; the chunks read came from the cache the prefetch
	// filled.
	if got := h.Fetched.Load(); got > int64(len(reads)) {
		t.Fatalf("reads after a prefetch fetched %d chunks from the store, want at most %d read ahead", got, len(reads))
	}
	cold := newStore(t, Options{Backend: b, ChunkSize: MiB, CacheDir: t.TempDir()})
	k, _ := cold.OpenLazy(ctx, "img-p", "disk.img")
	for _, off := range reads {
		k.ReadAt(buf, off)
	}
	k.Close()
	if k.Fetched.Load() <= h.Fetched.Load() {
		t.Fatalf("without a prefetch the reads fetched %d chunks, with one %d: the prefetch saved nothing", k.Fetched.Load(), h.Fetched.Load())
	}
}
