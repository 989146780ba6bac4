package template

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/store"
)

// markerImages is a BlockImages whose "image" is the tree's marker file,
// so that the catalog's use of its block images is tested without root
// or mkfs.erofs.
type markerImages struct{ built, extracted int }

func (m *markerImages) Build(_ context.Context, root, out string) error {
	m.built++
	b, err := os.ReadFile(filepath.Join(root, "marker"))
	if err != nil {
		return err
	}
	return os.WriteFile(out, append([]byte("image:"), b...), 0o644)
}

func (m *markerImages) Extract(_ context.Context, file, root string) error {
	m.extracted++
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, "marker"), []byte(strings.TrimPrefix(string(b), "image:")), 0o644)
}

// TestBlockImagesSeam: a catalog with BlockImages commits a template as
// a block image, published to the store under ImageManifestFile, which
// another host's catalog fetches through Extract; a catalog without one
// (the control plane's) lists it but neither makes nor reads images.
func TestBlockImagesSeam(t *testing.T) {
	dir := t.TempDir()
	backend, err := store.NewLocal(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	remote, err := store.New(store.Options{Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	open := func(name string, b BlockImages) *Catalog {
		c, err := NewCatalog(CatalogOptions{Dir: filepath.Join(dir, name), Remote: remote, Blocks: b})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ma, mb := &markerImages{}, &markerImages{}
	a, b, plain := open("a", ma), open("b", mb), open("plain", nil)

	st := stagedTemplate(t, a, "imaged", "one")
	// The mount points are there: no overlay (root) is needed to add them.
	for _, p := range mountPoints {
		os.MkdirAll(filepath.Join(st.RootFS(), filepath.Dir(p)), 0o755)
		os.WriteFile(filepath.Join(st.RootFS(), p), nil, 0o644)
	}
	if err := st.Commit(&Template{ID: "imaged"}); err != nil {
		t.Fatal(err)
	}
	got, err := a.GetLocal("imaged")
	if err != nil || ma.built != 1 || !strings.HasPrefix(got.BlockImage, ImagePrefix) || got.ImageFile == "" {
		t.Fatalf("committed with block images: %+v, %v (built %d)", got, err, ma.built)
	}
	m, err := remote.Get(context.Background(), got.BlockImage)
	if err != nil {
		t.Fatalf("the image's manifest: %v", err)
	}
	if len(m.Files) != 1 || m.Files[0].Name != ImageManifestFile {
		t.Fatalf("the image's manifest holds %+v, want one file %q", m.Files, ImageManifestFile)
	}

	fetched, err := b.Fetch(context.Background(), "imaged")
	if err != nil || mb.extracted != 1 {
		t.Fatalf("fetching on another host: %+v, %v (extracted %d)", fetched, err, mb.extracted)
	}
	if data, _ := os.ReadFile(filepath.Join(fetched.RootFS, "marker")); string(data) != "one" {
		t.Fatalf("the fetched tree's marker: %q", data)
	}

	if l, err := plain.Get("imaged"); err != nil || !l.Remote {
		t.Fatalf("the catalog without block images does not list the template: %+v, %v", l, err)
	}
	if _, err := plain.Fetch(context.Background(), "imaged"); err == nil {
		t.Fatal("a catalog without block images fetched a block image")
	}
	st = stagedTemplate(t, plain, "tree", "two")
	if err := st.Commit(&Template{ID: "tree"}); err != nil {
		t.Fatal(err)
	}
	if tr, err := plain.GetLocal("tree"); err != nil || tr.BlockImage != "" {
		t.Fatalf("committed without block images: %+v, %v", tr, err)
	}
}
