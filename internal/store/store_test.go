package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

const MiB = 1 << 20

// faultBackend wraps a real backend to count calls and to fail chunk
// uploads after a given number: a way to cut a Save off at a chosen point,
// not a stand-in for a backend.
type faultBackend struct {
	Backend
	failAfter atomic.Int64 // chunk Puts allowed before failing; <0 never fails
	chunkPuts atomic.Int64
	chunkGets atomic.Int64
	stats     atomic.Int64
}

func newFaultBackend(b Backend) *faultBackend {
	f := &faultBackend{Backend: b}
	f.failAfter.Store(-1)
	return f
}

func (f *faultBackend) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if strings.HasPrefix(key, "chunks/") {
		n := f.chunkPuts.Add(1)
		if lim := f.failAfter.Load(); lim >= 0 && n > lim {
			return fmt.Errorf("putting %s: %w", key, errInjected)
		}
	}
	return f.Backend.Put(ctx, key, r, size)
}

func (f *faultBackend) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if strings.HasPrefix(key, "chunks/") {
		f.chunkGets.Add(1)
	}
	return f.Backend.Get(ctx, key)
}

func (f *faultBackend) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	f.stats.Add(1)
	return f.Backend.Stat(ctx, key)
}

func newStore(t testing.TB, opts Options) *Repository {
	t.Helper()
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// writeFiles writes name → content into a new directory and returns the
// name → path map Save takes.
func writeFiles(t testing.TB, contents map[string][]byte) map[string]string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{}
	for name, data := range contents {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o640); err != nil {
			t.Fatal(err)
		}
		files[name] = p
	}
	return files
}

// checkDir asserts that dir holds exactly the files in want.
func checkDir(t *testing.T, dir string, want map[string][]byte) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(want) {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("%s holds %v, want %d files", dir, names, len(want))
	}
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sha256.Sum256(data) {
			t.Fatalf("%s: restored %d bytes differ from the %d saved", name, len(got), len(data))
		}
	}
}

func TestSaveRestoreRoundTrip(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		cacheDir := t.TempDir()
		s := newStore(t, Options{Backend: b, CacheDir: cacheDir})
		zeros := make([]byte, 9*MiB+77)
		copy(zeros[5*MiB:], "not all zero")
		contents := map[string][]byte{
			"empty.img":      {},
			"one.img":        {42},
			"odd.img":        randomBytes(1, 2*DefaultChunkSize+12345),
			"checkpoint.img": randomBytes(2, 64*MiB),
			"pages.img":      zeros,
			"text.json":      bytes.Repeat([]byte(`{"compressible": true}`), 100_000),
		}
		meta := []byte(`{"sandbox_id":"sbx1","template":"base"}`)
		m, st, err := s.Save(ctx, "snap-1", "", writeFiles(t, contents), meta)
		if err != nil {
			t.Fatal(err)
		}
		var total int64
		for _, d := range contents {
			total += int64(len(d))
		}
		if m.ID != "snap-1" || m.Size != total || len(m.Files) != len(contents) || string(m.Meta) != string(meta) {
			t.Fatalf("manifest %+v", m)
		}
		if st.Bytes != total || st.ChunksUploaded == 0 || st.ChunksZero < 1 {
			t.Fatalf("stats %+v", st)
		}
		// zstd must have shrunk the compressible file: everything but the
		// random files and the zero chunks went up compressed.
		randomBytesTotal := int64(len(contents["odd.img"]) + len(contents["checkpoint.img"]))
		if st.BytesUploaded > randomBytesTotal+2*MiB {
			t.Fatalf("uploaded %d bytes; random data is %d: compression or zero-chunk skipping failed", st.BytesUploaded, randomBytesTotal)
		}
		t.Logf("save: %+v", st)

		got, err := s.Get(ctx, "snap-1")
		if err != nil {
			t.Fatal(err)
		}
		if !got.Created.Equal(m.Created) || got.Size != m.Size || got.File("odd.img").Size != int64(len(contents["odd.img"])) {
			t.Fatalf("Get = %+v, want %+v", got, m)
		}
		list, err := s.List(ctx)
		if err != nil || len(list) != 1 || list[0].ID != "snap-1" {
			t.Fatalf("List = %v, %v", list, err)
		}

		// From the cache.
		fb := newFaultBackend(b)
		cached := newStore(t, Options{Backend: fb, CacheDir: cacheDir})
		dest := filepath.Join(t.TempDir(), "restore")
		if err := cached.Restore(ctx, "snap-1", dest); err != nil {
			t.Fatal(err)
		}
		checkDir(t, dest, contents)
		if n := fb.chunkGets.Load(); n != 0 {
			t.Fatalf("restore with a warm cache fetched %d chunks from the backend", n)
		}
		fi, err := os.Stat(filepath.Join(dest, "odd.img"))
		if err != nil || fi.Mode().Perm() != 0o640 {
			t.Fatalf("restored mode %v, %v; want 0640", fi.Mode(), err)
		}

		// From the backend, with no cache at all, over existing files.
		plain := newStore(t, Options{Backend: b, SyncRestore: true})
		if err := plain.Restore(ctx, "snap-1", dest); err != nil {
			t.Fatal(err)
		}
		checkDir(t, dest, contents)
	})
}

// TestDedup: a second snapshot after a 1 MiB change uploads about one
// chunk, whether the Save learns what exists from the parent's manifest or
// by asking the backend.
func TestDedup(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		a := randomBytes(3, 64*MiB)
		bb := bytes.Clone(a)
		copy(bb[32*MiB+100<<10:], randomBytes(4, MiB)) // unaligned, inside one chunk
		c := bytes.Clone(bb)
		copy(c[40*MiB-512<<10:], randomBytes(5, MiB)) // straddles a chunk boundary

		s := newStore(t, Options{Backend: b, CacheDir: t.TempDir()})
		if _, st, err := s.Save(ctx, "A", "", writeFiles(t, map[string][]byte{"mem": a}), nil); err != nil {
			t.Fatal(err)
		} else if st.ChunksUploaded != 16 {
			t.Fatalf("A: %+v, want 16 chunks uploaded", st)
		}

		// A fresh Store (another node, or a restart): only the parent's
		// manifest tells it what exists.
		fb := newFaultBackend(b)
		s2 := newStore(t, Options{Backend: fb, CacheDir: t.TempDir()})
		_, st, err := s2.Save(ctx, "B", "A", writeFiles(t, map[string][]byte{"mem": bb}), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("B: %+v, %d HEADs", st, fb.stats.Load())
		if st.ChunksTotal != 16 || st.ChunksUploaded != 1 || st.BytesUploaded > 2*DefaultChunkSize {
			t.Fatalf("B after a 1 MiB change: %+v; want 1 chunk, at most 2 chunks' bytes", st)
		}
		if n := fb.stats.Load(); n > 3 { // manifest existence + the new chunk
			t.Fatalf("B issued %d HEADs; parent chunks should need none", n)
		}

		// No parent named, fresh Store: the backend is asked per chunk.
		sc := newStore(t, Options{Backend: b})
		_, st, err = sc.Save(ctx, "C", "", writeFiles(t, map[string][]byte{"mem": c}), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("C: %+v", st)
		if st.ChunksUploaded != 2 || st.BytesUploaded > 2*DefaultChunkSize+64<<10 {
			t.Fatalf("C after a 1 MiB change across a boundary: %+v; want 2 chunks", st)
		}

		for id, want := range map[string][]byte{"B": bb, "C": c} {
			dest := t.TempDir()
			if err := sc.Restore(ctx, id, dest); err != nil {
				t.Fatal(err)
			}
			checkDir(t, dest, map[string][]byte{"mem": want})
		}
	})
}

func TestRestoreAfterCacheLoss(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		cacheDir := filepath.Join(t.TempDir(), "cache")
		fb := newFaultBackend(b)
		s := newStore(t, Options{Backend: fb, CacheDir: cacheDir})
		contents := map[string][]byte{"checkpoint.img": randomBytes(6, 10*MiB+5)}
		if _, _, err := s.Save(ctx, "s1", "", writeFiles(t, contents), nil); err != nil {
			t.Fatal(err)
		}
		if err := os.RemoveAll(cacheDir); err != nil {
			t.Fatal(err)
		}
		dest := t.TempDir()
		if err := s.Restore(ctx, "s1", dest); err != nil {
			t.Fatal(err)
		}
		checkDir(t, dest, contents)
		if n := fb.chunkGets.Load(); n != 3 {
			t.Fatalf("restore after cache loss fetched %d chunks, want 3", n)
		}
		// The restore refilled the cache: the next one needs no network.
		if err := s.Restore(ctx, "s1", t.TempDir()); err != nil {
			t.Fatal(err)
		}
		if n := fb.chunkGets.Load(); n != 3 {
			t.Fatalf("second restore fetched %d more chunks, want 0", n-3)
		}
		// A damaged cache entry is refetched, not restored.
		corruptOneFile(t, cacheDir)
		dest = t.TempDir()
		if err := s.Restore(ctx, "s1", dest); err != nil {
			t.Fatal(err)
		}
		checkDir(t, dest, contents)
		if n := fb.chunkGets.Load(); n != 4 {
			t.Fatalf("restore with one damaged cache entry fetched %d chunks, want 1", n-3)
		}
	})
}

// corruptOneFile flips a byte in the first regular file under dir.
func corruptOneFile(t *testing.T, dir string) string {
	t.Helper()
	var victim string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && victim == "" && d.Type().IsRegular() {
			victim = p
		}
		return nil
	})
	if victim == "" {
		t.Fatalf("no file under %s", dir)
	}
	data, err := os.ReadFile(victim)
	if err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 0xff
	if err := os.WriteFile(victim, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return victim
}

// TestCrashMidSave: a Save cut off after some chunk uploads leaves no
// manifest, the catalog unchanged, the previous snapshot restorable, and a
// retry that uploads only what is still missing.
func TestCrashMidSave(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		s := newStore(t, Options{Backend: b, ChunkSize: MiB})
		a := randomBytes(7, 16*MiB)
		if _, _, err := s.Save(ctx, "sbx-1", "", writeFiles(t, map[string][]byte{"mem": a, "meta": []byte("x")}), nil); err != nil {
			t.Fatal(err)
		}
		next := randomBytes(8, 16*MiB)
		files := writeFiles(t, map[string][]byte{"mem": next, "meta": []byte("y")})

		fb := newFaultBackend(b)
		fb.failAfter.Store(5)
		crashing := newStore(t, Options{Backend: fb, ChunkSize: MiB, Concurrency: 4})
		_, st, err := crashing.Save(ctx, "sbx-2", "sbx-1", files, nil)
		if !errors.Is(err, errInjected) {
			t.Fatalf("Save = %v, want the injected failure", err)
		}
		if !strings.Contains(err.Error(), "saving snapshot sbx-2") {
			t.Fatalf("error %q does not name the snapshot", err)
		}
		t.Logf("failed save: %v (%+v)", err, st)
		if _, err := s.Get(ctx, "sbx-2"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Get after failed Save = %v, want ErrNotFound", err)
		}
		list, err := s.List(ctx)
		if err != nil || len(list) != 1 || list[0].ID != "sbx-1" {
			t.Fatalf("List after failed Save = %v, %v", list, err)
		}
		if err := s.Restore(ctx, "sbx-2", t.TempDir()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("Restore of the failed snapshot = %v, want ErrNotFound", err)
		}
		dest := t.TempDir()
		if err := s.Restore(ctx, "sbx-1", dest); err != nil {
			t.Fatal(err)
		}
		checkDir(t, dest, map[string][]byte{"mem": a, "meta": []byte("x")})

		// The retry skips the chunks that made it: at most 5 (uploads in
		// flight when the 6th failed were cancelled, though the server may
		// have finished one the client already gave up on).
		objs, err := b.List(ctx, "chunks/")
		if err != nil {
			t.Fatal(err)
		}
		made := len(objs) - 17 // sbx-1 has 17 chunks
		if made < st.ChunksUploaded || made > 5 {
			t.Fatalf("failed Save left %d chunks (%d counted), want %d-5", made, st.ChunksUploaded, st.ChunksUploaded)
		}
		fb.failAfter.Store(-1)
		_, st, err = crashing.Save(ctx, "sbx-2", "sbx-1", files, nil)
		if err != nil {
			t.Fatal(err)
		}
		if st.ChunksUploaded != 17-made {
			t.Fatalf("retry uploaded %d chunks, want %d", st.ChunksUploaded, 17-made)
		}
		dest = t.TempDir()
		if err := s.Restore(ctx, "sbx-2", dest); err != nil {
			t.Fatal(err)
		}
		checkDir(t, dest, map[string][]byte{"mem": next, "meta": []byte("y")})
	})
}

func TestCorruptChunk(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		s := newStore(t, Options{Backend: b, ChunkSize: MiB})
		contents := map[string][]byte{"mem": randomBytes(9, 3*MiB)}
		m, _, err := s.Save(ctx, "c1", "", writeFiles(t, contents), nil)
		if err != nil {
			t.Fatal(err)
		}
		key := chunkKey(m.Files[0].Chunks[1].Hash)
		data := get(t, b, key)
		data[len(data)/2] ^= 1
		put(t, b, key, data)

		dest := t.TempDir()
		err = s.Restore(ctx, "c1", dest)
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Restore of a corrupted chunk = %v, want ErrCorrupt", err)
		}
		for _, want := range []string{"restoring snapshot c1", "chunk 1 of file mem", "checksum mismatch"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
		if entries, _ := os.ReadDir(dest); len(entries) != 0 {
			t.Fatalf("failed restore left %d files in %s", len(entries), dest)
		}

		// A chunk replaced by one compressed with garbage fails the same way.
		put(t, b, key, append([]byte{codecZstd}, data[1:]...))
		if err := s.Restore(ctx, "c1", dest); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Restore of a chunk with a bad zstd frame = %v, want ErrCorrupt", err)
		}
	})
}

func TestGC(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		s := newStore(t, Options{Backend: b, ChunkSize: MiB, GCGrace: -1})
		shared := randomBytes(10, 4*MiB)
		mk := func(seed uint64) []byte { return append(bytes.Clone(shared), randomBytes(seed, 2*MiB)...) }
		snaps := map[string][]byte{"a": mk(11), "b": mk(12), "c": mk(13)}
		for _, id := range []string{"a", "b", "c"} {
			if _, _, err := s.Save(ctx, id, "", writeFiles(t, map[string][]byte{"mem": snaps[id]}), nil); err != nil {
				t.Fatal(err)
			}
		}
		if st, err := s.GC(ctx); err != nil || st.ChunksDeleted != 0 || st.ChunksKept != 4+3*2 {
			t.Fatalf("GC with every snapshot live = %+v, %v", st, err)
		}
		if err := s.Delete(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second Delete = %v, want ErrNotFound", err)
		}
		st, err := s.GC(ctx)
		if err != nil || st.ChunksDeleted != 2 || st.ChunksKept != 4+2*2 || st.BytesDeleted < 2*MiB {
			t.Fatalf("GC after deleting b = %+v, %v; want b's 2 own chunks deleted", st, err)
		}
		objs, err := b.List(ctx, "chunks/")
		if err != nil || len(objs) != 8 {
			t.Fatalf("%d chunks left, want 8 (%v)", len(objs), err)
		}
		fresh := newStore(t, Options{Backend: b})
		for _, id := range []string{"a", "c"} {
			dest := t.TempDir()
			if err := fresh.Restore(ctx, id, dest); err != nil {
				t.Fatal(err)
			}
			checkDir(t, dest, map[string][]byte{"mem": snaps[id]})
		}

		// The chunks of a Save still in flight (no manifest yet) are young:
		// the default grace period spares them.
		orphan := s.encode(randomBytes(14, MiB))
		sum := sha256.Sum256(randomBytes(14, MiB))
		put(t, b, chunkKey(fmt.Sprintf("%x", sum)), orphan)
		graceful := newStore(t, Options{Backend: b})
		if st, err := graceful.GC(ctx); err != nil || st.ChunksDeleted != 0 || st.ChunksSpared != 1 {
			t.Fatalf("GC with grace = %+v, %v; want the orphan spared", st, err)
		}
		if st, err := s.GC(ctx); err != nil || st.ChunksDeleted != 1 {
			t.Fatalf("GC without grace = %+v, %v; want the orphan deleted", st, err)
		}
		// A deleted chunk is forgotten: saving b again uploads it again.
		_, sst, err := s.Save(ctx, "b2", "", writeFiles(t, map[string][]byte{"mem": snaps["b"]}), nil)
		if err != nil || sst.ChunksUploaded != 2 {
			t.Fatalf("re-saving b = %+v, %v; want its 2 own chunks uploaded", sst, err)
		}
	})
}

func TestGCRefusesUnreadableManifest(t *testing.T) {
	ctx := context.Background()
	b := newLocalBackend(t)
	s := newStore(t, Options{Backend: b, ChunkSize: MiB, GCGrace: -1})
	if _, _, err := s.Save(ctx, "ok", "", writeFiles(t, map[string][]byte{"mem": randomBytes(15, MiB)}), nil); err != nil {
		t.Fatal(err)
	}
	put(t, b, "snapshots/broken/manifest.json", []byte("{not json"))
	if _, err := s.GC(ctx); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("GC over a broken manifest = %v, want ErrCorrupt and no sweep", err)
	}
	if objs, _ := b.List(ctx, "chunks/"); len(objs) != 1 {
		t.Fatalf("GC deleted chunks despite failing: %d left", len(objs))
	}
}

func TestGCRemovesStaleTemps(t *testing.T) {
	ctx := context.Background()
	b := newLocalBackend(t)
	s := newStore(t, Options{Backend: b, ChunkSize: MiB})
	if _, _, err := s.Save(ctx, "ok", "", writeFiles(t, map[string][]byte{"mem": randomBytes(17, MiB)}), nil); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(b.root, "chunks", "ab")
	os.MkdirAll(dir, 0o755)
	stale, fresh := filepath.Join(dir, tmpPrefix+"1"), filepath.Join(dir, tmpPrefix+"2")
	os.WriteFile(stale, []byte("left by a crash"), 0o644)
	os.WriteFile(fresh, []byte("being written"), 0o644)
	old := time.Now().Add(-2 * DefaultGCGrace)
	os.Chtimes(stale, old, old)
	st, err := s.GC(ctx)
	if err != nil || st.TempsRemoved != 1 || st.ChunksKept != 1 {
		t.Fatalf("GC = %+v, %v; want 1 stale temp removed, the chunk kept", st, err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatal("stale temporary file kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Fatal("fresh temporary file removed")
	}
}

func TestSaveRejects(t *testing.T) {
	ctx := context.Background()
	b := newLocalBackend(t)
	s := newStore(t, Options{Backend: b})
	files := writeFiles(t, map[string][]byte{"f": []byte("data")})
	if _, _, err := s.Save(ctx, "x", "", files, nil); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, id, parent string
		files            map[string]string
		meta             []byte
		want             error
		msg              string
	}{
		{"existing id", "x", "", files, nil, ErrExists, "already exists"},
		{"missing parent", "y", "nope", files, nil, ErrNotFound, "parent snapshot nope"},
		{"bad id", "../y", "", files, nil, nil, "invalid snapshot id"},
		{"bad file name", "y", "", map[string]string{"a/b": files["f"]}, nil, nil, "invalid file name"},
		{"bad meta", "y", "", files, []byte("{"), nil, "not valid JSON"},
		{"missing file", "y", "", map[string]string{"f": "/nonexistent/file"}, nil, os.ErrNotExist, "reading file f"},
		{"directory", "y", "", map[string]string{"f": t.TempDir()}, nil, nil, "not a regular file"},
	}
	for _, c := range cases {
		_, _, err := s.Save(ctx, c.id, c.parent, c.files, c.meta)
		if err == nil || (c.want != nil && !errors.Is(err, c.want)) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: Save = %v, want %v containing %q", c.name, err, c.want, c.msg)
		}
	}
	if list, _ := s.List(ctx); len(list) != 1 {
		t.Fatalf("rejected Saves changed the catalog: %d snapshots", len(list))
	}
	if _, err := s.Get(ctx, "y"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(y) = %v", err)
	}
}

// TestSaveRestoreConcurrent runs Saves and Restores of several sandboxes at
// once on one Store (the race detector checks the shared state).
func TestSaveRestoreConcurrent(t *testing.T) {
	ctx := context.Background()
	b := newLocalBackend(t)
	s := newStore(t, Options{Backend: b, CacheDir: t.TempDir(), ChunkSize: 256 << 10, Concurrency: 3})
	base := randomBytes(16, 2*MiB)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			data := bytes.Clone(base)
			copy(data[i*100_000:], randomBytes(uint64(100+i), 10_000))
			id := fmt.Sprintf("sbx-%d", i)
			if _, _, err := s.Save(ctx, id, "", writeFiles(t, map[string][]byte{"mem": data}), nil); err != nil {
				errs <- err
				return
			}
			dest := t.TempDir()
			if err := s.Restore(ctx, id, dest); err != nil {
				errs <- err
				return
			}
			got, _ := os.ReadFile(filepath.Join(dest, "mem"))
			if !bytes.Equal(got, data) {
				errs <- fmt.Errorf("%s restored wrong", id)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestChunkCacheLRU(t *testing.T) {
	dir := t.TempDir()
	c, err := openChunkCache(dir, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	h := func(i int) string { return fmt.Sprintf("%064x", i) }
	for i := range 4 {
		c.put(h(i), make([]byte, 3000))
		time.Sleep(10 * time.Millisecond) // distinct mtimes for the reopen below
	}
	// 4*3000 > 10000: the oldest went.
	if c.has(h(0)) || !c.has(h(3)) || c.usage() != 9000 {
		t.Fatalf("after 4 puts: has(0)=%v has(3)=%v usage=%d", c.has(h(0)), c.has(h(3)), c.usage())
	}
	if _, ok := c.get(h(1)); !ok { // 1 becomes most recent
		t.Fatal("miss on 1")
	}
	c.put(h(4), make([]byte, 3000))
	if c.has(h(2)) || !c.has(h(1)) {
		t.Fatal("LRU evicted the wrong entry")
	}
	c.put(h(5), make([]byte, 20_000)) // larger than the cache: ignored
	if c.has(h(5)) {
		t.Fatal("cached an entry larger than the cache")
	}
	// Reopening finds the files (and drops stray temporaries).
	os.WriteFile(filepath.Join(dir, tmpPrefix+"junk"), []byte("x"), 0o644)
	c2, err := openChunkCache(dir, 6000)
	if err != nil {
		t.Fatal(err)
	}
	if c2.usage() != 6000 {
		t.Fatalf("reopened cache holds %d bytes, want 6000 (evicted to the new bound)", c2.usage())
	}
	if _, err := os.Stat(filepath.Join(dir, tmpPrefix+"junk")); !os.IsNotExist(err) {
		t.Fatal("stray temporary file kept")
	}
	// The cache directory vanishing costs misses, not errors.
	os.RemoveAll(dir)
	if _, ok := c2.get(h(4)); ok {
		t.Fatal("hit after the directory was removed")
	}
	c2.put(h(6), []byte("back"))
	if data, ok := c2.get(h(6)); !ok || string(data) != "back" {
		t.Fatal("cache did not recover after its directory was removed")
	}
}

// TestSaveReusesLinkedFiles: a file of several hard links saved before
// (each checkpoint's link to its build's /.aenv image) is not read again
// while it is unchanged and its chunks are known in the backend; a file
// of one link always is, a rewritten one is read again, and so is one
// whose chunks a GC deleted since.
func TestSaveReusesLinkedFiles(t *testing.T) {
	backends(t, func(t *testing.T, b Backend) {
		ctx := context.Background()
		s := newStore(t, Options{Backend: b, ChunkSize: MiB, GCGrace: -1})
		image := writeFiles(t, map[string][]byte{"tools": randomBytes(20, 3*MiB)})["tools"]
		link := func() string {
			p := filepath.Join(t.TempDir(), "tools")
			if err := os.Link(image, p); err != nil {
				t.Fatal(err)
			}
			return p
		}
		mem := randomBytes(21, MiB)
		save := func(id string) SaveStats {
			t.Helper()
			files := writeFiles(t, map[string][]byte{"mem": mem})
			files["tools"] = link()
			_, st, err := s.Save(ctx, id, "", files, nil)
			if err != nil {
				t.Fatal(err)
			}
			return st
		}
		restored := func(id string) {
			t.Helper()
			want, err := os.ReadFile(image)
			if err != nil {
				t.Fatal(err)
			}
			dest := t.TempDir()
			if err := s.Restore(ctx, id, dest); err != nil {
				t.Fatal(err)
			}
			checkDir(t, dest, map[string][]byte{"mem": mem, "tools": want})
		}

		if st := save("a"); st.FilesReused != 0 || st.ChunksTotal != 4 {
			t.Fatalf("first save: %+v, want nothing reused, 4 chunks", st)
		}
		if st := save("b"); st.FilesReused != 1 || st.ChunksTotal != 4 {
			t.Fatalf("second save: %+v, want the linked file reused (and the other read), 4 chunks", st)
		}
		restored("b")

		// Rewritten in place, size kept: read again.
		if err := os.WriteFile(image, randomBytes(22, 3*MiB), 0o640); err != nil {
			t.Fatal(err)
		}
		later := time.Now().Add(time.Hour)
		if err := os.Chtimes(image, later, later); err != nil {
			t.Fatal(err)
		}
		if st := save("c"); st.FilesReused != 0 || st.ChunksUploaded != 3 {
			t.Fatalf("after a rewrite: %+v, want the file read again, its 3 new chunks uploaded", st)
		}
		restored("c")

		// Its chunks deleted by a GC: read again, and uploaded again.
		for _, id := range []string{"a", "b", "c"} {
			if err := s.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := s.GC(ctx); err != nil {
			t.Fatal(err)
		}
		if st := save("d"); st.FilesReused != 0 || st.ChunksUploaded != 4 {
			t.Fatalf("after a GC: %+v, want every chunk read and uploaded again", st)
		}
		restored("d")
	})
}
