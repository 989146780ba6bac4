package blockimage

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/store"
)

// BenchmarkLazyStart compares, on an empty cache, starting Python with
// numpy and pandas from a stored image mounted lazily against fetching the
// whole image first (eager), on a large tree: AENV_BENCH_ROOTFS (the
// code-interpreter tree, ~1.4 GB) or else AENV_BASE_ROOTFS. It reports the
// time to the interpreter's first output and the bytes fetched. Run:
//
//	AENV_BENCH_ROOTFS=/var/cache/aenv/code-interpreter-rootfs go test -run '^$' -bench LazyStart -benchtime 1x ./internal/blockimage
func BenchmarkLazyStart(b *testing.B) {
	root := os.Getenv("AENV_BENCH_ROOTFS")
	if root == "" {
		root = os.Getenv("AENV_BASE_ROOTFS")
	}
	if root == "" || os.Geteuid() != 0 {
		b.Skip("needs root and AENV_BENCH_ROOTFS or AENV_BASE_ROOTFS")
	}
	ctx := context.Background()
	work := b.TempDir()
	img := filepath.Join(work, "image.erofs")
	start := time.Now()
	if err := Build(ctx, root, img); err != nil {
		b.Fatal(err)
	}
	b.Logf("built the image in %v", time.Since(start))
	backend, err := store.NewLocal(filepath.Join(work, "store"))
	if err != nil {
		b.Fatal(err)
	}
	// Images are cut finer than snapshots: a read then fetches less.
	pub, _ := store.New(store.Options{Backend: backend, ChunkSize: 1 << 20})
	if _, _, err := pub.Save(ctx, "img", "", map[string]string{"image": img}, nil); err != nil {
		b.Fatal(err)
	}
	fi, _ := os.Stat(img)
	py := "import sys; print('ok')"
	if _, err := os.Stat(filepath.Join(root, "usr/lib/python3/dist-packages/pandas")); err == nil {
		py = "import numpy, pandas; print('ok')"
	}
	run := func(dir string) time.Duration {
		exec.Command("sh", "-c", "echo 3 > /proc/sys/vm/drop_caches").Run()
		s := time.Now()
		if out, err := exec.Command("chroot", dir, "/usr/bin/python3", "-c", py).CombinedOutput(); err != nil || string(out) != "ok\n" {
			b.Fatalf("python3 in the image: %v: %s", err, out)
		}
		return time.Since(s)
	}
	for i := 0; i < b.N; i++ {
		// Lazy, cold.
		node, _ := store.New(store.Options{Backend: backend, CacheDir: filepath.Join(work, "cache-lazy", time.Now().Format("150405.000"))})
		s := time.Now()
		lf, err := node.OpenLazy(ctx, "img", "image")
		if err != nil {
			b.Fatal(err)
		}
		m, err := Mount(filepath.Join(work, "lazy"), lf, nil)
		if err != nil {
			b.Fatal(err)
		}
		mounted := time.Since(s)
		pyLazy := run(m.Dir)
		lazyTotal := time.Since(s)
		lazyBytes := lf.FetchedBytes.Load()
		warm := run(m.Dir)
		m.Close()
		trace := lf.Trace()
		lf.Close()

		// Lazy, cold, on another node with the first start's trace:
		// its chunks in one batch first.
		other, _ := store.New(store.Options{Backend: backend, CacheDir: filepath.Join(work, "cache-pf", time.Now().Format("150405.000"))})
		s = time.Now()
		pf, err := other.OpenLazy(ctx, "img", "image")
		if err != nil {
			b.Fatal(err)
		}
		if err := pf.Prefetch(ctx, trace); err != nil {
			b.Fatal(err)
		}
		prefetched := time.Since(s)
		m2, err := Mount(filepath.Join(work, "lazy-pf"), pf, nil)
		if err != nil {
			b.Fatal(err)
		}
		run(m2.Dir)
		pfTotal := time.Since(s)
		m2.Close()
		pf.Close()
		b.ReportMetric(float64(pfTotal.Milliseconds()), "prefetched-cold-ms")
		b.ReportMetric(float64(prefetched.Milliseconds()), "prefetch-ms")

		// Eager: the whole image fetched, then mounted from local disk.
		eagerStore, _ := store.New(store.Options{Backend: backend})
		s = time.Now()
		dir := filepath.Join(work, "eager")
		os.RemoveAll(dir)
		if err := eagerStore.Restore(ctx, "img", dir); err != nil {
			b.Fatal(err)
		}
		mnt := filepath.Join(work, "eager-root")
		os.MkdirAll(mnt, 0o755)
		if out, err := exec.Command("mount", "-o", "ro,loop", "-t", "erofs", filepath.Join(dir, "image"), mnt).CombinedOutput(); err != nil {
			b.Fatalf("mounting the eager image: %v: %s", err, out)
		}
		pyEager := run(mnt)
		eagerTotal := time.Since(s)
		exec.Command("umount", mnt).Run()

		b.ReportMetric(float64(fi.Size())/1e6, "image-MB")
		b.ReportMetric(float64(lazyBytes)/1e6, "lazy-fetched-MB")
		b.ReportMetric(100*float64(lazyBytes)/float64(fi.Size()), "lazy-fetched-%")
		b.ReportMetric(float64(mounted.Milliseconds()), "lazy-mount-ms")
		b.ReportMetric(float64(lazyTotal.Milliseconds()), "lazy-cold-ms")
		b.ReportMetric(float64(warm.Milliseconds()), "lazy-warm-python-ms")
		b.ReportMetric(float64(eagerTotal.Milliseconds()), "eager-cold-ms")
		b.ReportMetric(float64(eagerTotal)/float64(lazyTotal), "eager/lazy")
		b.ReportMetric(float64(eagerTotal)/float64(pfTotal), "eager/prefetched")
		b.Logf("python: lazy %v (cold, incl. fetches), eager %v after the whole image", pyLazy, pyEager)
	}
}
