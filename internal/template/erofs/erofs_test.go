package erofs_test

import (
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/template/erofs"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestManifestFileIsServed: catalogs publish a block image under the name
// the image server serves it as, or nodes could mount none of them.
func TestManifestFileIsServed(t *testing.T) {
	if template.ImageManifestFile != blockimage.ImageName {
		t.Fatalf("templates publish their images as %q, the image server serves %q", template.ImageManifestFile, blockimage.ImageName)
	}
}

// TestUsageDeduplicates: two templates whose trees share a large file are
// two images, but the store keeps the shared part once; each template's
// unique bytes are what only its image has.
func TestUsageDeduplicates(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.erofs", "")
	dir := t.TempDir()
	s := storeOver(t, dir, "templates")
	shared := make([]byte, 16<<20)
	rand.Read(shared)
	for _, id := range []string{"one", "two"} {
		st, err := s.NewStage(id)
		if err != nil {
			t.Fatal(err)
		}
		own := make([]byte, 4<<20)
		rand.Read(own)
		for name, data := range map[string][]byte{"shared": shared, id: own} {
			if err := os.WriteFile(filepath.Join(st.RootFS(), name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Commit(&template.Template{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	u, err := s.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("images %d bytes, stored %d, unique %v", u.ImageBytes, u.StoredBytes, u.Templates)
	if u.ImageBytes < 40<<20 || u.StoredBytes > u.ImageBytes-12<<20 {
		t.Fatalf("two images sharing 16 MiB: %d bytes as images, %d stored: not deduplicated", u.ImageBytes, u.StoredBytes)
	}
	for _, id := range []string{"one", "two"} {
		if n := u.Templates[id]; n < 4<<20 || n > 8<<20 {
			t.Fatalf("template %s's unique bytes: %d, want its own 4 MiB (and its metadata)", id, n)
		}
	}
	// The images hold the files.
	one, _ := s.GetLocal("one")
	if one.BlockImage == "" || one.ImageFile == "" {
		t.Fatalf("a committed template without its block image: %+v", one)
	}
}

// TestFetchFromImage: a host without a template's files (a build starting
// from it) fetches them from its block image in the store: the same
// files, modes, owners and links as the tree it was made from (with the
// image's empty mount points, which sandboxes get bound over anyway).
func TestFetchFromImage(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireBinary(t, "mkfs.erofs", "")
	dir := t.TempDir()
	a, b := storeOver(t, dir, "a"), storeOver(t, dir, "b")
	st, err := a.NewStage("shipped")
	if err != nil {
		t.Fatal(err)
	}
	root := st.RootFS()
	os.MkdirAll(filepath.Join(root, "etc"), 0o755)
	os.WriteFile(filepath.Join(root, "etc", "conf"), []byte("setting=1\n"), 0o640)
	os.Chown(filepath.Join(root, "etc", "conf"), 1000, 1000)
	os.Symlink("conf", filepath.Join(root, "etc", "link"))
	if err := st.Commit(&template.Template{ID: "shipped"}); err != nil {
		t.Fatal(err)
	}
	remote, err := b.Get("shipped")
	if err != nil || !remote.Remote || remote.BlockImage == "" {
		t.Fatalf("the other host's view: %+v %v", remote, err)
	}
	got, err := b.Fetch(context.Background(), "shipped")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(got.RootFS, "etc", "conf"))
	fi, _ := os.Lstat(filepath.Join(got.RootFS, "etc", "conf"))
	if err != nil || string(data) != "setting=1\n" || fi.Mode().Perm() != 0o640 || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Fatalf("fetched file: %q %v %v", data, fi.Mode(), err)
	}
	if l, err := os.Readlink(filepath.Join(got.RootFS, "etc", "link")); err != nil || l != "conf" {
		t.Fatalf("fetched symlink: %q %v", l, err)
	}
	if got.ImageFile == "" {
		t.Fatal("the fetched template does not keep its image")
	}
}

// storeOver opens a template store in dir/name publishing to the store
// in dir/store, as a host of a cluster does.
func storeOver(t *testing.T, dir, name string) *template.Catalog {
	t.Helper()
	backend, err := store.NewLocal(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	remote, _ := store.New(store.Options{Backend: backend})
	images, _ := store.New(store.Options{Backend: backend, ChunkSize: 1 << 20})
	s, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(dir, name), Remote: remote, Images: images, Blocks: erofs.Images{}})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
