package template

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/testutil"
)

func TestStoreGetAndList(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "prebuilt")
	if err := os.MkdirAll(filepath.Join(base, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "bin", "bash"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := NewCatalog(CatalogOptions{Dir: filepath.Join(dir, "templates"), BaseRootFS: base})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Get(BaseID)
	if err != nil {
		t.Fatalf("base: %v", err)
	}
	if b.RootFS != base || b.CPUCount != 2 || b.MemoryMB != 512 {
		t.Fatalf("base = %+v", b)
	}
	if err := s.Put(&Template{ID: "py", Aliases: []string{"python"}, CPUCount: 1, MemoryMB: 256}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"py", "python"} {
		got, err := s.Get(name)
		if err != nil || got.ID != "py" || got.RootFS != filepath.Join(dir, "templates", "py", "rootfs") {
			t.Fatalf("Get(%q) = %+v, %v", name, got, err)
		}
	}
	for _, bad := range []string{"nope", "../etc", "", "UPPER", "a/b"} {
		if _, err := s.Get(bad); err == nil {
			t.Fatalf("Get(%q) succeeded", bad)
		}
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].ID != BaseID || list[1].ID != "py" {
		t.Fatalf("List = %v", list)
	}
	if err := s.Put(&Template{ID: "../x"}); err == nil {
		t.Fatal("Put accepted a traversal id")
	}
}

func TestBaseMissing(t *testing.T) {
	s, err := NewCatalog(CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(BaseID); err == nil {
		t.Fatal("base found in an empty store")
	}
}

// TestBuiltBase checks the tree BuildBase produced (make base builds it
// with `aenv template build-base`): what E2B users' code relies on.
func TestBuiltBase(t *testing.T) {
	root := os.Getenv("AENV_BASE_ROOTFS")
	if root == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS not set (make base builds it)")
	}
	for _, p := range []string{"bin/bash", "usr/bin/python3", "usr/bin/env", "bin/ls", "etc/ssl/certs", "home/user"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("base rootfs lacks %s: %v", p, err)
		}
	}
	f, err := os.Open(filepath.Join(root, "etc/passwd"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "user:x:1000:1000:") && strings.HasSuffix(sc.Text(), ":/home/user:/bin/bash") {
			found = true
		}
	}
	if !found {
		t.Fatal("base rootfs has no user 'user' (uid 1000, home /home/user, bash)")
	}
	if _, err := os.Stat(root + ".building"); err == nil {
		t.Fatal("a half-built tree was left beside the base rootfs")
	}
	// A login shell reads /etc/profile for every command: it must not
	// run id(1) under bash.
	profile, err := os.ReadFile(filepath.Join(root, "etc/profile"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(strings.ReplaceAll(string(profile), profileQuickUID, ""), "$(id -u)") {
		t.Fatalf("the base's /etc/profile runs id(1) for bash (built before quickProfile? remove the cache and make base):\n%s", profile)
	}
}

// TestQuickProfile: the rewritten profile sets root's PATH and a user's
// alike under bash (from EUID, running no id) and under dash (from id).
func TestQuickProfile(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	debian := `if [ "$(id -u)" -eq 0 ]; then
  PATH="/usr/sbin:/usr/bin"
else
  PATH="/usr/bin"
fi
export PATH
`
	must(os.WriteFile(filepath.Join(root, "etc/profile"), []byte(debian), 0o644))
	must(quickProfile(root))
	must(quickProfile(root)) // twice: the same
	got, err := os.ReadFile(filepath.Join(root, "etc/profile"))
	must(err)
	if want := strings.Replace(debian, profileUID, profileQuickUID, 1); string(got) != want {
		t.Fatalf("rewritten profile:\n%s\nwant:\n%s", got, want)
	}
	want := "/usr/bin"
	if os.Geteuid() == 0 {
		want = "/usr/sbin:/usr/bin"
	}
	for _, sh := range []string{"bash", "sh"} {
		// id is off the PATH: bash must not need it, dash must find it.
		script := `. ` + filepath.Join(root, "etc/profile") + `; echo "$PATH"`
		env := []string{"PATH=/nonexistent"}
		if sh == "sh" {
			env = []string{"PATH=/usr/bin:/bin"}
		}
		cmd := exec.Command("/bin/"+sh, "-c", script)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Fatalf("%s reading the profile: %q %v, want PATH %s", sh, out, err, want)
		}
	}
	must(quickProfile(t.TempDir())) // no /etc/profile: nothing to do
}

func TestAptMirror(t *testing.T) {
	if _, err := os.Stat("/etc/apt"); err != nil {
		t.Skip("not a Debian host: no apt sources to read")
	}
	m, err := aptMirror()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m, "http") {
		t.Fatalf("mirror %q is not a URL", m)
	}
}

// TestFreshBaseImage: the base tree's image counts only while it is newer
// than the tree, and base carries it only where the catalog is told to.
func TestFreshBaseImage(t *testing.T) {
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "bash"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := FreshBaseImage(root); got != "" {
		t.Fatalf("no image: got %q", got)
	}
	writeFakeImage(t, BaseImageFile(root))
	if got := FreshBaseImage(root); got != BaseImageFile(root) {
		t.Fatalf("image made after the tree: got %q", got)
	}
	for _, on := range []bool{false, true} {
		c, err := NewCatalog(CatalogOptions{Dir: t.TempDir(), BaseRootFS: root, BaseImage: on})
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Get(BaseID)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.ImageFile != ""; got != on {
			t.Errorf("BaseImage %v: base's ImageFile %q", on, b.ImageFile)
		}
		if got := b.RootImage() != ""; got != on {
			t.Errorf("BaseImage %v: base's RootImage %q", on, b.RootImage())
		}
	}
	// The tree rebuilt in place after the image was made.
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(filepath.Join(root, "bin"), later, later); err != nil {
		t.Fatal(err)
	}
	if got := FreshBaseImage(root); got != "" {
		t.Fatalf("stale image: got %q", got)
	}
}

// writeFakeImage writes a file that stands for an EROFS image where only
// its superblock (bytes 1024-1151) is read: random, as a build's UUID is.
func writeFakeImage(t *testing.T, file string) {
	t.Helper()
	b := make([]byte, 8192)
	rand.Read(b)
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestBaseImagePublished: base run from its image names it by its
// superblock, a rebuilt image gets another name, and PublishBaseImage
// puts the image into the store under that name, where another host's
// catalog reads it back whole; publishing again finds it there, and puts it
// back once the store's collector deleted it; a name this host's base no
// longer has is refused unless the store has it, and without a store
// nothing is done.
func TestBaseImagePublished(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "bash"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFakeImage(t, BaseImageFile(root))
	backend, err := store.NewLocal(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	images, err := store.New(store.Options{Backend: backend})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCatalog(CatalogOptions{Dir: filepath.Join(dir, "templates"), BaseRootFS: root, BaseImage: true, Remote: images})
	if err != nil {
		t.Fatal(err)
	}
	base, err := c.Get(BaseID)
	if err != nil {
		t.Fatal(err)
	}
	id := base.RootImage()
	if want, err := BaseImageID(BaseImageFile(root)); err != nil || id != want || !strings.HasPrefix(id, ImagePrefix) {
		t.Fatalf("base's RootImage %q, want BaseImageID %q (%v) under %q", id, want, err, ImagePrefix)
	}
	if base.BlockImage != "" {
		t.Fatalf("base got a BlockImage %q: it is served from its tree", base.BlockImage)
	}
	ctx := context.Background()
	if err := c.PublishBaseImage(ctx, id); err != nil {
		t.Fatal(err)
	}
	got := filepath.Join(dir, "fetched")
	if err := images.Restore(ctx, id, got); err != nil {
		t.Fatalf("the published image: %v", err)
	}
	want, _ := os.ReadFile(BaseImageFile(root))
	if b, err := os.ReadFile(filepath.Join(got, ImageManifestFile)); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("the image read back from the store differs (%d bytes, %v)", len(b), err)
	}
	if err := c.PublishBaseImage(ctx, id); err != nil {
		t.Fatalf("publishing again: %v", err)
	}
	// The store's collector deleted it (no sandbox used it for a while):
	// the next publish puts it back.
	if err := images.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := c.PublishBaseImage(ctx, id); err != nil {
		t.Fatalf("publishing after a collection: %v", err)
	}
	if err := images.Restore(ctx, id, filepath.Join(dir, "back")); err != nil {
		t.Fatalf("the image was not published again after a collection: %v", err)
	}

	// The image rebuilt: a new name, and the old one can no longer be
	// published from here.
	writeFakeImage(t, BaseImageFile(root))
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(BaseImageFile(root), later, later); err != nil {
		t.Fatal(err)
	}
	rebuilt, err := c.Get(BaseID)
	if err != nil {
		t.Fatal(err)
	}
	if rebuilt.RootImage() == id || rebuilt.RootImage() == "" {
		t.Fatalf("rebuilt image named %q, was %q", rebuilt.RootImage(), id)
	}
	if err := c.PublishBaseImage(ctx, "image-base-0123456789abcdef0123456789abcdef"); err == nil || !strings.Contains(err.Error(), rebuilt.RootImage()) {
		t.Fatalf("publishing an image base does not run on, and the store lacks: %v", err)
	}
	// Another host's (or this one's before a restart): in the store, so
	// a sandbox restored from it can be snapshotted here.
	restarted, err := NewCatalog(CatalogOptions{Dir: filepath.Join(dir, "templates"), BaseRootFS: root, BaseImage: true, Remote: images})
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.PublishBaseImage(ctx, id); err != nil {
		t.Fatalf("an image in the store, not this host's base: %v", err)
	}

	local, err := NewCatalog(CatalogOptions{Dir: filepath.Join(dir, "local"), BaseRootFS: root, BaseImage: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := local.PublishBaseImage(ctx, rebuilt.RootImage()); err != nil {
		t.Fatalf("without a store: %v", err)
	}
}
