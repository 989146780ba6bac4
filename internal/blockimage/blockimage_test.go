package blockimage

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestLazyImage builds an erofs image of the base template, stores it
// chunked, and mounts it on a node that has none of it: its files read
// back identical while only a small part of the image was fetched, and a
// corrupted chunk makes reads fail (EIO), never return wrong bytes.
func TestLazyImage(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.erofs", "")
	testutil.RequireBinary(t, "losetup", "")
	base := os.Getenv("AENV_BASE_ROOTFS")
	if base == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS not set (make base builds it)")
	}
	ctx := context.Background()
	work := t.TempDir()
	before := mountedImages(t)
	img := filepath.Join(work, "base.erofs")
	if err := Build(ctx, base, img); err != nil {
		t.Fatal(err)
	}
	backend, err := store.NewLocal(filepath.Join(work, "store"))
	if err != nil {
		t.Fatal(err)
	}
	publisher, err := store.New(store.Options{Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := publisher.Save(ctx, "image-base", "", map[string]string{"image": img}, nil); err != nil {
		t.Fatal(err)
	}
	node, err := store.New(store.Options{Backend: backend, CacheDir: filepath.Join(work, "cache")})
	if err != nil {
		t.Fatal(err)
	}
	lf, err := node.OpenLazy(ctx, "image-base", "image")
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	m, err := Mount(filepath.Join(work, "mnt"), lf, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, f := range []string{"bin/bash", "etc/os-release", "usr/bin/python3"} {
		want, err := os.ReadFile(filepath.Join(base, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(m.Dir, f))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s through the lazy image: %v (%d bytes, want %d)", f, err, len(got), len(want))
		}
	}
	fetched := lf.FetchedBytes.Load()
	t.Logf("image %d bytes; fetched %d (%.1f%%) to read bash, python3 and os-release", lf.Size(), fetched, 100*float64(fetched)/float64(lf.Size()))
	if fetched*2 > lf.Size() {
		t.Fatalf("fetched %d of %d bytes: not lazy", fetched, lf.Size())
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}

	// A corrupted chunk, on a node without a cache: reads fail.
	man, err := publisher.Get(ctx, "image-base")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range man.File("image").Chunks {
		p := filepath.Join(work, "store", "chunks", c.Hash[:2], c.Hash)
		if _, err := os.Stat(p); err == nil {
			os.WriteFile(p, bytes.Repeat([]byte{0}, 100), 0o644)
		}
	}
	bare, err := store.New(store.Options{Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	lf2, err := bare.OpenLazy(ctx, "image-base", "image")
	if err != nil {
		t.Fatal(err)
	}
	defer lf2.Close()
	if _, err := lf2.ReadAt(make([]byte, 4096), 0); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("a corrupted image's first block: %v, want ErrCorrupt", err)
	}
	if _, err := Mount(filepath.Join(work, "mnt2"), lf2, nil); err == nil {
		t.Fatal("a corrupted image mounted")
	}
	if n := mountedImages(t); n != before {
		t.Fatalf("%d image FUSE mounts left behind", n-before)
	}
}

// mountedImages counts this package's FUSE mounts still in place.
func mountedImages(t *testing.T) int {
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("aenv-image "))
}
