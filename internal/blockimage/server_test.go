package blockimage

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/testutil"
	"github.com/aenvhq/aenv/internal/testutil/s3gw"
)

// imageFixture is a stored image of a tree of random (incompressible)
// files, which the tests read back through an image server.
type imageFixture struct {
	work, tree string
	backend    store.Backend
	// goAway and comeBack take the store away and back.
	goAway, comeBack func()
	// damage changes the stored bytes of chunk hash.
	damage    func(hash string)
	image     string
	manifest  *store.Manifest
	imageSize int64
}

// backendKinds are the stores the image server is tested against: a
// local directory, and a real S3 server (versitygw) behind a proxy that
// can be switched off.
var backendKinds = []string{"local", "s3"}

// forBackends runs fn as a subtest on each kind of store.
func forBackends(t *testing.T, fn func(t *testing.T, kind string)) {
	for _, kind := range backendKinds {
		t.Run(kind, func(t *testing.T) { fn(t, kind) })
	}
}

// newImageFixture builds an image of files random files of size bytes
// each and publishes it to a store of the given kind in 256 KiB chunks.
func newImageFixture(t *testing.T, kind string, files, size int) *imageFixture {
	t.Helper()
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.erofs", "")
	testutil.RequireBinary(t, "losetup", "")
	f := &imageFixture{work: t.TempDir(), image: "image-test"}
	switch kind {
	case "local":
		f.localStore(t)
	default:
		f.s3Store(t)
	}
	f.tree = filepath.Join(f.work, "tree")
	for i := range files {
		p := filepath.Join(f.tree, fmt.Sprintf("d%d", i%4), fmt.Sprintf("f%d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, size)
		rand.Read(b)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img := filepath.Join(f.work, "image.erofs")
	if err := Build(context.Background(), f.tree, img); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(img)
	f.imageSize = fi.Size()
	pub, err := store.New(store.Options{Backend: f.backend, ChunkSize: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if f.manifest, _, err = pub.Save(context.Background(), f.image, "", map[string]string{ImageName: img}, nil); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *imageFixture) localStore(t *testing.T) {
	dir := filepath.Join(f.work, "store")
	b, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	f.backend = b
	f.goAway = func() { must(t, os.Rename(dir, dir+".gone")) }
	f.comeBack = func() { must(t, os.Rename(dir+".gone", dir)) }
	f.damage = func(hash string) {
		p := filepath.Join(dir, "chunks", hash[:2], hash)
		b, err := os.ReadFile(p)
		must(t, err)
		b[len(b)/2] ^= 0xff
		must(t, os.WriteFile(p, b, 0o644))
	}
}

var (
	gwOnce sync.Once
	gw     *s3gw.Gateway
	gwErr  error
)

// s3Store is a bucket of its own on the package's S3 server, reached
// through a proxy that goAway switches to refusing (503, as a gateway
// in front of a store that went down answers).
func (f *imageFixture) s3Store(t *testing.T) {
	gwOnce.Do(func() {
		var bin string
		if bin, gwErr = s3gw.Build(os.TempDir()); gwErr == nil {
			gw, gwErr = s3gw.Start(bin, filepath.Join(os.TempDir(), fmt.Sprintf("aenv-blockimage-s3-%d", os.Getpid())), false)
		}
	})
	if gwErr != nil {
		t.Fatalf("starting the S3 server: %v", gwErr)
	}
	bucket := fmt.Sprintf("img%d", bucketN.Add(1))
	must(t, gw.CreateBucket(context.Background(), bucket))
	target, _ := url.Parse(gw.Endpoint)
	var off atomic.Bool
	rp := httputil.NewSingleHostReverseProxy(target)
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if off.Load() {
			http.Error(w, "store down", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	b, err := store.Open(context.Background(), "s3://"+bucket+"/p?region=us-east-1&path_style=true&endpoint="+proxy.URL,
		store.OpenOptions{AccessKeyID: gw.AccessKey, SecretAccessKey: gw.SecretKey})
	must(t, err)
	f.backend = b
	f.goAway = func() { off.Store(true) }
	f.comeBack = func() { off.Store(false) }
	f.damage = func(hash string) {
		key := "p/chunks/" + hash[:2] + "/" + hash
		p := filepath.Join(gw.DataDir, bucket, key)
		data, err := os.ReadFile(p)
		must(t, err)
		data[len(data)/2] ^= 0xff
		must(t, os.WriteFile(p, data, 0o644))
	}
}

var bucketN atomic.Int32

func TestMain(m *testing.M) {
	code := m.Run()
	if gw != nil {
		gw.Stop()
		os.RemoveAll(gw.DataDir)
	}
	os.Exit(code)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// server starts an image server over the fixture's store with its own
// cache directory (bounded by cacheMax) and log.
func (f *imageFixture) server(t *testing.T, cacheDir string, cacheMax int64, log *testutil.SyncBuffer, traceWindow time.Duration) *Server {
	t.Helper()
	st, err := store.New(store.Options{Backend: f.backend, CacheDir: cacheDir, CacheMaxBytes: cacheMax})
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	if log != nil {
		logger = slog.New(slog.NewTextHandler(log, nil))
	}
	s, err := NewServer(ServerConfig{Store: st, WorkDir: filepath.Join(f.work, "mounts"), Grace: 200 * time.Millisecond,
		TraceWindow: traceWindow, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); st.Close() })
	return s
}

// compareTree reads every file of the fixture's tree through dir and
// fails on the first difference.
func (f *imageFixture) compareTree(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(f.tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(f.tree, p)
		want, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			return fmt.Errorf("%s through the image: %w", rel, err)
		}
		if sha256.Sum256(got) != sha256.Sum256(want) {
			return fmt.Errorf("%s through the image: wrong bytes", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// dropCaches makes the next reads of a mount go to the image again.
func dropCaches() { os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200) }

// mountsUnder counts the mounts whose mount point is under dir.
func mountsUnder(t *testing.T, dir, fstype string) int {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		fl := strings.Fields(line)
		if len(fl) >= 3 && strings.HasPrefix(fl[1], dir) && fl[2] == fstype {
			n++
		}
	}
	return n
}

// TestServerSharesOneMount: eight sandboxes of one image on a node use
// one mount; it stays while any holds it, goes after the grace period once
// none does, and a restarted node's Sync lets go of the sandboxes that
// did not survive.
func TestServerSharesOneMount(t *testing.T) {
	forBackends(t, func(t *testing.T, kind string) {
		f := newImageFixture(t, kind, 8, 1<<20)
		s := f.server(t, filepath.Join(f.work, "cache"), 1<<30, nil, time.Hour)
		ctx := context.Background()
		src := Source{Image: f.image, Template: "t"}
		dirs := make([]string, 8)
		errs := make([]error, 8)
		var wg sync.WaitGroup
		for i := range dirs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dirs[i], errs[i] = s.Acquire(ctx, src, fmt.Sprintf("sb%d", i))
			}()
		}
		wg.Wait()
		for i := range dirs {
			if errs[i] != nil || dirs[i] != dirs[0] {
				t.Fatalf("holder %d: %q %v; holder 0: %q", i, dirs[i], errs[i], dirs[0])
			}
		}
		if n := mountsUnder(t, filepath.Join(f.work, "mounts"), "erofs"); n != 1 {
			t.Fatalf("%d erofs mounts for 8 sandboxes of one image, want 1", n)
		}
		f.compareTree(t, dirs[0])
		if imgs := s.Images(); len(imgs) != 1 || len(imgs[0].Holders) != 8 {
			t.Fatalf("images: %+v", imgs)
		}
		// Sandboxes 2..7 did not survive a node restart.
		if n := s.Sync([]string{"sb0", "sb1"}); n != 6 {
			t.Fatalf("sync released %d holders, want 6", n)
		}
		s.Release("sb0")
		time.Sleep(600 * time.Millisecond)
		if n := mountsUnder(t, filepath.Join(f.work, "mounts"), "erofs"); n != 1 {
			t.Fatalf("the image was released while sb1 held it (%d mounts)", n)
		}
		f.compareTree(t, dirs[0])
		s.Release("sb1")
		deadline := time.Now().Add(5 * time.Second)
		for mountsUnder(t, filepath.Join(f.work, "mounts"), "erofs") != 0 {
			if time.Now().After(deadline) {
				t.Fatal("an image nobody holds was not released after the grace period")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if n := mountsUnder(t, filepath.Join(f.work, "mounts"), "fuse"); n != 0 {
			t.Fatalf("%d FUSE mounts left after release", n)
		}
	})
}

// TestServerCacheBound: with a cache much smaller than the image, reading
// the whole image twice gives the right bytes both times, and the cache
// never holds more than its bound.
func TestServerCacheBound(t *testing.T) {
	forBackends(t, func(t *testing.T, kind string) {
		f := newImageFixture(t, kind, 24, 1<<20) // 24 MiB, incompressible
		const bound = 4 << 20
		cacheDir := filepath.Join(f.work, "cache")
		s := f.server(t, cacheDir, bound, nil, time.Hour)
		dir, err := s.Acquire(context.Background(), Source{Image: f.image, Template: "t"}, "sb")
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		var peak int64
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				peak = max(peak, dirSize(cacheDir))
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
			}
		}()
		for range 2 {
			dropCaches()
			f.compareTree(t, dir)
		}
		close(stop)
		wg.Wait()
		cs := s.cfg.Store.CacheStats()
		t.Logf("image %d bytes, cache bound %d: peak on disk %d, evictions %d", f.imageSize, bound, peak, cs.Evictions)
		// A chunk being written may sit beside a full cache for a moment.
		if peak > bound+256<<10+4096 || cs.Bytes > bound {
			t.Fatalf("the cache grew to %d bytes on disk (%d accounted), bound %d", peak, cs.Bytes, bound)
		}
		if cs.Evictions == 0 {
			t.Fatal("a cache smaller than the image evicted nothing")
		}
		// What the node's report takes: the cache's figures, and its
		// images' reads summed.
		var reads int64
		for _, img := range s.Images() {
			reads += img.Hits + img.Misses
		}
		if got := s.CacheStats(); got.MaxBytes != bound || got.Bytes > bound || got.Evictions < cs.Evictions ||
			got.Mounted != 1 || got.Misses == 0 || got.Hits+got.Misses != reads {
			t.Fatalf("cache stats %+v; want bound %d, %d evictions or more, one image mounted, %d reads", got, bound, cs.Evictions, reads)
		}
	})
}

func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}

// TestServerStoreOutage: a store that goes away mid-read fails the reads
// that need it with EIO and a log line saying why; once it is back the
// same reads succeed with the right bytes.
func TestServerStoreOutage(t *testing.T) {
	forBackends(t, func(t *testing.T, kind string) {
		f := newImageFixture(t, kind, 8, 1<<20)
		var log testutil.SyncBuffer
		s := f.server(t, filepath.Join(f.work, "cache"), 1<<30, &log, time.Hour)
		dir, err := s.Acquire(context.Background(), Source{Image: f.image, Template: "t"}, "sb")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.ReadFile(filepath.Join(dir, "d0", "f0")); err != nil {
			t.Fatal(err)
		}
		// The store goes away.
		f.goAway()
		_, err = os.ReadFile(filepath.Join(dir, "d3", "f7"))
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("reading an unfetched file with the store gone: %v, want EIO", err)
		}
		if !strings.Contains(log.String(), "block image read failed") || !strings.Contains(log.String(), f.image) {
			t.Fatalf("the log does not say which read failed:\n%s", log.String())
		}
		t.Logf("the log says: %s", lastLine(log.String()))
		// It comes back.
		f.comeBack()
		dropCaches()
		f.compareTree(t, dir)
	})
}

// TestServerCorruptChunk: a chunk whose bytes changed in the store is
// caught by its hash: reads of it fail with EIO (never wrong bytes) and
// the log names the chunk.
func TestServerCorruptChunk(t *testing.T) {
	forBackends(t, func(t *testing.T, kind string) {
		f := newImageFixture(t, kind, 8, 1<<20)
		var log testutil.SyncBuffer
		s := f.server(t, filepath.Join(f.work, "cache"), 1<<30, &log, time.Hour)
		// Every chunk past the first few (the file system's own metadata)
		// is damaged.
		chunks := f.manifest.File(ImageName).Chunks
		damaged := map[string]bool{}
		for _, c := range chunks[4:] {
			if !damaged[c.Hash] {
				f.damage(c.Hash)
				damaged[c.Hash] = true
			}
		}
		dir, err := s.Acquire(context.Background(), Source{Image: f.image, Template: "t"}, "sb")
		if err != nil {
			t.Fatal(err)
		}
		bad := 0
		filepath.WalkDir(f.tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(f.tree, p)
			want, _ := os.ReadFile(p)
			got, err := os.ReadFile(filepath.Join(dir, rel))
			switch {
			case err == nil && !bytes.Equal(got, want):
				t.Fatalf("%s: wrong bytes from a corrupted image", rel)
			case err != nil && !errors.Is(err, syscall.EIO):
				t.Fatalf("%s: %v, want EIO", rel, err)
			case err != nil:
				bad++
			}
			return nil
		})
		if bad == 0 {
			t.Fatal("no read failed on a corrupted image")
		}
		named := false
		for h := range damaged {
			if strings.Contains(log.String(), h) {
				named = true
				break
			}
		}
		if !named || !strings.Contains(log.String(), store.ErrCorrupt.Error()) {
			t.Fatalf("the log does not name a corrupted chunk:\n%s", log.String())
		}
	})
}

// TestServerWarmRestart: an image server started again over the cache a
// previous one filled (a node restart) fetches nothing for an image it
// had, prefetch list included.
func TestServerWarmRestart(t *testing.T) {
	forBackends(t, func(t *testing.T, kind string) {
		f := newImageFixture(t, kind, 8, 1<<20)
		cacheDir := filepath.Join(f.work, "cache")
		s := f.server(t, cacheDir, 1<<30, nil, 10*time.Millisecond)
		dir, err := s.Acquire(context.Background(), Source{Image: f.image, Template: "t"}, "sb")
		if err != nil {
			t.Fatal(err)
		}
		f.compareTree(t, dir)
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, err := s.cfg.Store.Get(context.Background(), traceID(f.image)); err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("no prefetch list was stored")
			}
			time.Sleep(20 * time.Millisecond)
		}
		s.Close()

		s2 := f.server(t, cacheDir, 1<<30, nil, time.Hour)
		dir, err = s2.Acquire(context.Background(), Source{Image: f.image, Template: "t"}, "sb")
		if err != nil {
			t.Fatal(err)
		}
		dropCaches()
		f.compareTree(t, dir)
		img := s2.Images()[0]
		if img.FetchedBytes != 0 || img.Misses != 0 || img.Hits == 0 {
			t.Fatalf("after a restart with a warm cache: fetched %d bytes, %d misses, %d hits; want nothing fetched", img.FetchedBytes, img.Misses, img.Hits)
		}
	})
}

// TestServerPrefetch: a cold start of an image with a stored prefetch
// list fetches the listed chunks up front, so that reading what the
// first start read needs (nearly) no fetch of its own: the kernel's
// read-ahead around those reads varies a little from run to run.
func TestServerPrefetch(t *testing.T) {
	forBackends(t, func(t *testing.T, kind string) {
		f := newImageFixture(t, kind, 16, 1<<20)
		// The trace covers the reads of its first 2 s: on a loaded
		// machine the two reads below took longer than a shorter window,
		// and the trace missed some of their chunks.
		s := f.server(t, filepath.Join(f.work, "cache1"), 1<<30, nil, 2*time.Second)
		dir, err := s.Acquire(context.Background(), Source{Image: f.image, Template: "t"}, "sb")
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"d1/f5", "d2/f10"} {
			if _, err := os.ReadFile(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		var tr *store.Manifest
		for tr == nil {
			tr, _ = s.cfg.Store.Get(context.Background(), traceID(f.image))
			if time.Now().After(deadline) {
				t.Fatal("no prefetch list was stored")
			}
			time.Sleep(20 * time.Millisecond)
		}
		s.mu.Lock()
		first := s.images[f.image].lazy
		s.mu.Unlock()
		first.Close()
		cold := first.Fetched.Load()
		s.Close()

		// Another node: an empty cache.
		s2 := f.server(t, filepath.Join(f.work, "cache2"), 1<<30, nil, time.Hour)
		dir, err = s2.Acquire(context.Background(), Source{Image: f.image, Template: "t"}, "sb")
		if err != nil {
			t.Fatal(err)
		}
		var listed traceRecord
		if err := json.Unmarshal(tr.Meta, &listed); err != nil || len(listed.Chunks) == 0 {
			t.Fatalf("stored prefetch list %s: %v", tr.Meta, err)
		}
		s2.mu.Lock()
		lazy := s2.images[f.image].lazy
		s2.mu.Unlock()
		deadline = time.Now().Add(5 * time.Second)
		for lazy.Fetched.Load() < int64(len(listed.Chunks)) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		lazy.Close()
		before := lazy.Fetched.Load()
		for _, name := range []string{"d1/f5", "d2/f10"} {
			if _, err := os.ReadFile(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		lazy.Close()
		after := lazy.Fetched.Load()
		t.Logf("first start fetched %d chunks; with the prefetch list %d up front and %d more for the same reads", cold, before, after-before)
		if (after-before)*4 > cold {
			t.Fatalf("reading what the first start read fetched %d more chunks after the prefetch, of %d without one", after-before, cold)
		}
		if before == 0 {
			t.Fatal("the prefetch fetched nothing")
		}
	})
}

// TestServeStopsWhenSocketGone: an image server whose socket was removed
// (its run directory deleted) stops instead of lingering unreachable.
func TestServeStopsWhenSocketGone(t *testing.T) {
	dir := t.TempDir()
	s, err := NewServer(ServerConfig{WorkDir: filepath.Join(dir, "mounts")})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "server.sock")
	done := make(chan error, 1)
	go func() { done <- s.Serve(context.Background(), socket) }()
	c := NewClient(socket)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := c.Info(context.Background()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the image server did not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	must(t, os.Remove(socket))
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(3 * socketGoneEvery):
		t.Fatal("the image server outlived its socket")
	}
}

// TestServerImageFile: an acquired image names its file, which reads as
// the image itself, whether served on demand or from a file this node
// has whole (gVisor without a gofer mounts it from there).
func TestServerImageFile(t *testing.T) {
	forBackends(t, func(t *testing.T, kind string) {
		f := newImageFixture(t, kind, 4, 1<<20)
		s := f.server(t, filepath.Join(f.work, "cache"), 1<<30, nil, time.Hour)
		want, err := os.ReadFile(filepath.Join(f.work, "image.erofs"))
		if err != nil {
			t.Fatal(err)
		}
		lazy, err := s.AcquireImage(context.Background(), Source{Image: f.image, Template: "t"}, "sb")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release("sb")
		if got, err := os.ReadFile(lazy.File); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("the served image's file %q: %d bytes (%v), want the image's %d", lazy.File, len(got), err, len(want))
		}
		local := filepath.Join(f.work, "image.erofs")
		whole, err := s.AcquireImage(context.Background(), Source{Image: f.image + "local", Template: "t", File: local}, "sb2")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release("sb2")
		if whole.File != local {
			t.Fatalf("an image this node has whole: file %q, want %q", whole.File, local)
		}
	})
}
