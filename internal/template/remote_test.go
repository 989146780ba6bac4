package template

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/aenvhq/aenv/internal/store"
)

// TestPublishAndFetch: a template put on one host is published to the
// store; another host lists it, fetches it with its files as they were
// (contents, modes, symlinks, hard links), and deleting it there removes
// it from the store.
func TestPublishAndFetch(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	backend, err := store.Open(ctx, filepath.Join(dir, "shared"), store.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	remote, err := store.New(store.Options{Backend: backend, ContentDefined: true})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	log := slog.New(slog.DiscardHandler)
	a, err := NewCatalog(CatalogOptions{Dir: filepath.Join(dir, "a"), Remote: remote, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewCatalog(CatalogOptions{Dir: filepath.Join(dir, "b"), Remote: remote, Logger: log})
	if err != nil {
		t.Fatal(err)
	}

	root := filepath.Join(dir, "a", "mytpl", "rootfs")
	must(t, os.MkdirAll(filepath.Join(root, "usr", "bin"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "usr", "bin", "tool"), []byte("#!/bin/sh\necho tool\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(root, "etc-file"), []byte("config"), 0o600))
	must(t, os.Symlink("usr/bin/tool", filepath.Join(root, "link")))
	must(t, os.Link(filepath.Join(root, "etc-file"), filepath.Join(root, "hard")))
	if err := a.Put(&Template{ID: "mytpl", Aliases: []string{"my-alias"}, CPUCount: 1, MemoryMB: 256}); err != nil {
		t.Fatal(err)
	}

	listed, err := b.List()
	if err != nil {
		t.Fatal(err)
	}
	var seen *Template
	for _, tpl := range listed {
		if tpl.ID == "mytpl" {
			seen = tpl
		}
	}
	if seen == nil || !seen.Remote {
		t.Fatalf("the other host lists %+v, want mytpl from the store", listed)
	}
	if local, _ := b.ListLocal(); len(local) != 0 {
		t.Fatalf("the other host holds %d templates before fetching", len(local))
	}
	if tpl, err := b.Get("my-alias"); err != nil || tpl.ID != "mytpl" || !tpl.Remote {
		t.Fatalf("looking up the alias: %+v %v", tpl, err)
	}
	got, err := b.Fetch(ctx, "mytpl")
	if err != nil {
		t.Fatal(err)
	}
	if got.Remote || got.MemoryMB != 256 || got.RootFS != filepath.Join(dir, "b", "mytpl", "rootfs") {
		t.Fatalf("fetched: %+v", got)
	}
	if b, err := os.ReadFile(filepath.Join(got.RootFS, "usr", "bin", "tool")); err != nil || string(b) != "#!/bin/sh\necho tool\n" {
		t.Fatalf("fetched file: %q %v", b, err)
	}
	for name, mode := range map[string]os.FileMode{"usr/bin/tool": 0o755, "etc-file": 0o600} {
		if fi, err := os.Stat(filepath.Join(got.RootFS, name)); err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s: mode %v %v, want %v", name, fi.Mode(), err, mode)
		}
	}
	if l, err := os.Readlink(filepath.Join(got.RootFS, "link")); err != nil || l != "usr/bin/tool" {
		t.Fatalf("symlink: %q %v", l, err)
	}
	f1, _ := os.Stat(filepath.Join(got.RootFS, "etc-file"))
	f2, _ := os.Stat(filepath.Join(got.RootFS, "hard"))
	if !os.SameFile(f1, f2) {
		t.Fatal("the hard link became a copy")
	}
	if local, _ := b.ListLocal(); len(local) != 1 {
		t.Fatalf("after the fetch the host holds %d templates, want 1", len(local))
	}

	if err := b.Delete("mytpl"); err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Get(ctx, remoteID("mytpl")); err == nil {
		t.Fatal("deleted, the template is still in the store")
	}
	if _, err := a.Get("mytpl"); err != nil {
		t.Fatalf("the first host's own copy: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
