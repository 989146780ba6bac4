package gvisor

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/testutil"
)

// TestWithoutGofer: a sandbox whose root is an EROFS image runs with no
// gofer process, its files on disk, /.aenv and /etc/hosts in place; its
// checkpoint is marked so, a prepared sandbox with a gofer refuses it
// (and is removed), one without takes it, with the files, and its hosts
// file follows the new host name.
func TestWithoutGofer(t *testing.T) {
	f := setupConfig(t, Config{RootImages: true})
	mkfs := testutil.RequireBinary(t, "mkfs.erofs", "")
	if err := requireEdit(f.driver.cfg.RunscPath, goferlessEdit); err != nil || !f.driver.rootImages {
		t.Fatalf("the driver runs sandboxes without a gofer: %v (%v), want true with aenv's runsc build", f.driver.rootImages, err)
	}
	ctx := context.Background()
	t.Cleanup(func() { f.driver.Close() })
	img := filepath.Join(t.TempDir(), "root.erofs")
	if out, err := exec.Command(mkfs, "--quiet", "-Enoinline_data", img, f.rootfs).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	spec, slot := f.spec(t, "gvgl")
	spec.Root.Image, spec.DiskMB, spec.Hostname = img, 256, "gvglparent"
	if err := f.driver.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.driver.Kill(context.Background(), spec.ID) })
	waitHealth(t, slot.HostAddr)
	if n := testutil.Gofers(t, f.driver.runc.Root); n != 0 {
		t.Fatalf("%d gofer processes run for a sandbox whose root is an image", n)
	}
	f.run(t, spec.ID, "dd if=/dev/urandom of=/big bs=1M count=32 2>/dev/null && sync")
	if st, err := f.driver.Stats(ctx, spec.ID); err != nil || st.DiskBytes < 30<<20 {
		t.Fatalf("disk %d bytes (%v) after writing 32 MiB: the root's writes are not in a file on disk", st.DiskBytes, err)
	}
	out := f.run(t, spec.ID, "cat /etc/hosts /etc/resolv.conf; ls /.aenv")
	for _, want := range []string{"127.0.1.1\tgvglparent", "envd"} {
		if !strings.Contains(out, want) {
			t.Errorf("the sandbox lacks %q:\n%s", want, out)
		}
	}
	// (runsc exec gives the spec's environment; envd's commands get envd's.)
	if v := envdEnv(t, slot.HostAddr, hostsEnv); v != "" {
		t.Errorf("envd's commands inherit %s=%q", hostsEnv, v)
	}

	// The checkpoint does not need the image file any more (a template
	// removed while its sandbox runs).
	moved := img + ".moved"
	if err := os.Rename(img, moved); err != nil {
		t.Fatal(err)
	}
	saved := t.TempDir()
	err := f.driver.Checkpoint(ctx, spec.ID, saved, runtime.CheckpointOptions{LeaveRunning: true})
	if rerr := os.Rename(moved, img); rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, marked := markedImage(saved); !marked {
		t.Fatal("the checkpoint of a sandbox without a gofer is not marked so")
	}
	if tools, ok := readIdentity(filepath.Join(saved, toolsImageMarker)); !ok || tools == "" {
		t.Fatal("the checkpoint does not record its /.aenv image")
	}

	withGofer, _ := f.spec(t, "gvglg")
	if err := f.driver.Prepare(ctx, withGofer); err != nil {
		t.Fatal(err)
	}
	if err := f.driver.RestorePrepared(ctx, withGofer, saved); !errors.Is(err, errOtherRootMode) {
		t.Fatalf("restoring into a prepared sandbox with a gofer: %v, want %v", err, errOtherRootMode)
	}
	if _, err := os.Stat(f.driver.sandboxDir(withGofer.ID)); !os.IsNotExist(err) {
		t.Errorf("the refused prepared sandbox is still there: %v", err)
	}
	if err := f.driver.Restore(ctx, withGofer, saved); err == nil || !strings.Contains(err.Error(), "image") {
		t.Errorf("restoring without the root's image: %v, want an error naming the image", err)
	}
	// Another host's image of the same tree (its own mkfs: another UUID
	// and build time) cannot take the saved state.
	other := filepath.Join(t.TempDir(), "other.erofs")
	if out, err := exec.Command(mkfs, "--quiet", "-Enoinline_data", other, f.rootfs).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	elsewhere, _ := f.spec(t, "gvglo")
	elsewhere.Root.Image, elsewhere.DiskMB = other, spec.DiskMB
	if err := f.driver.Restore(ctx, elsewhere, saved); err == nil || !strings.Contains(err.Error(), "another image") {
		t.Errorf("restoring from another image of the tree: %v, want an error saying so", err)
	}
	otherPrep, _ := f.spec(t, "gvglop")
	otherPrep.Root.Image, otherPrep.DiskMB = other, spec.DiskMB
	if err := f.driver.Prepare(ctx, otherPrep); err != nil {
		t.Fatal(err)
	}
	if err := f.driver.RestorePrepared(ctx, otherPrep, saved); !errors.Is(err, errOtherRootMode) {
		t.Errorf("restoring into a prepared sandbox of another image: %v, want %v", err, errOtherRootMode)
	}

	child, cslot := f.spec(t, "gvglc")
	child.Root.Image, child.DiskMB = img, spec.DiskMB
	if err := f.driver.Prepare(ctx, child); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.driver.Kill(context.Background(), child.ID) })
	if err := f.driver.RestorePrepared(ctx, child, saved); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, cslot.HostAddr)
	if out := f.run(t, child.ID, "ls -l /big"); !strings.Contains(out, "33554432") {
		t.Errorf("the restored sandbox lost the file written before its checkpoint: %s", out)
	}
	// The restored kernel keeps the prepared sandbox's host name; envd's
	// hosts file must name it, not the saved sandbox's.
	name := strings.TrimSpace(f.run(t, child.ID, "hostname"))
	if hosts := f.run(t, child.ID, "cat /etc/hosts"); name == "gvglparent" || !strings.Contains(hosts, "127.0.1.1\t"+name+"\n") {
		t.Errorf("host name %q, /etc/hosts:\n%s", name, hosts)
	}

	// aenv upgraded (an envd of other bytes): a prepared sandbox, which
	// mounts the new /.aenv image, refuses the checkpoint; a restore runs
	// it under the image the checkpoint keeps, the envd it saved; its own
	// checkpoint keeps that image again.
	upgraded := filepath.Join(t.TempDir(), "envd")
	b, err := os.ReadFile(f.envd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(upgraded, append(b, 0), 0o755); err != nil {
		t.Fatal(err)
	}
	newPrep, _ := f.spec(t, "gvglup")
	newPrep.Root.Image, newPrep.DiskMB, newPrep.EnvdPath = img, spec.DiskMB, upgraded
	if err := f.driver.Prepare(ctx, newPrep); err != nil {
		t.Fatal(err)
	}
	if err := f.driver.RestorePrepared(ctx, newPrep, saved); !errors.Is(err, errOtherTools) {
		t.Errorf("restoring into a prepared sandbox of another envd build: %v, want %v", err, errOtherTools)
	}
	after, aslot := f.spec(t, "gvglu")
	after.Root.Image, after.DiskMB, after.EnvdPath = img, spec.DiskMB, upgraded
	if err := f.driver.Restore(ctx, after, saved); err != nil {
		t.Fatalf("restoring under another envd build: %v", err)
	}
	t.Cleanup(func() { f.driver.Kill(context.Background(), after.ID) })
	waitHealth(t, aslot.HostAddr)
	if out := f.run(t, after.ID, "ls -l /big"); !strings.Contains(out, "33554432") {
		t.Errorf("the sandbox restored under another envd build lost its file: %s", out)
	}
	if got, _ := readIdentity(filepath.Join(f.driver.sandboxDir(after.ID), toolsImagePath)); !strings.HasPrefix(filepath.Base(got), "saved-") {
		t.Errorf("the sandbox restored under another envd build runs /.aenv from %q, want the checkpoint's image", got)
	}
	resaved := t.TempDir()
	if err := f.driver.Checkpoint(ctx, after.ID, resaved, runtime.CheckpointOptions{LeaveRunning: true}); err != nil {
		t.Fatal(err)
	}
	if a, b := readFileOr(t, filepath.Join(saved, toolsImageMarker)), readFileOr(t, filepath.Join(resaved, toolsImageMarker)); a != b {
		t.Errorf("the checkpoint of the sandbox restored under another envd build records /.aenv %s, want %s", b, a)
	}
	if _, err := os.Stat(filepath.Join(resaved, savedToolsImage)); err != nil {
		t.Errorf("the checkpoint of the sandbox restored under another envd build does not keep its image: %v", err)
	}

	// A driver no longer told to run new sandboxes without a gofer still
	// restores a checkpoint that ran so, the way it ran.
	f.driver.rootImages = false
	later, _ := f.spec(t, "gvgll")
	later.Root.Image, later.DiskMB = img, spec.DiskMB
	if err := f.driver.Restore(ctx, later, saved); err != nil {
		t.Fatalf("restoring with RootImages off: %v", err)
	}
	t.Cleanup(func() { f.driver.Kill(context.Background(), later.ID) })
	if without := recordedImage(f.driver.sandboxDir(later.ID)) != ""; !without {
		t.Errorf("restored with RootImages off: without a gofer %v, want true", without)
	}
}

// readFileOr returns the contents of file, failing the test without it.
func readFileOr(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestToolsImageSameEverywhere: the /.aenv image of the same binaries is
// the same bytes whatever their paths and times on the host, so that a
// sandbox saved on one host restores on another (gVisor compares the
// image's superblock), and it is made once per set of binaries.
func TestToolsImageSameEverywhere(t *testing.T) {
	testutil.RequireBinary(t, "mkfs.erofs", "")
	image := func(stamp time.Time) string {
		dir := t.TempDir()
		envd := filepath.Join(dir, "envd")
		if err := os.WriteFile(envd, []byte("#!/bin/true\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(envd, stamp, stamp); err != nil {
			t.Fatal(err)
		}
		d := &Driver{cfg: Config{StateDir: filepath.Join(dir, "state")}, log: slog.Default()}
		spec := runtime.Spec{EnvdPath: envd}
		img, err := d.toolsImage(context.Background(), spec)
		if err != nil {
			t.Fatal(err)
		}
		if again, err := d.toolsImage(context.Background(), spec); err != nil || again != img {
			t.Fatalf("a second start made another image: %q (%v), first %q", again, err, img)
		}
		return img
	}
	a, err := os.ReadFile(image(time.Unix(1e9, 0)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(image(time.Unix(2e9, 0)))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two hosts' /.aenv images of the same binary differ")
	}
}

// TestRequireEdit: a runsc that refuses `aenv-edits` (as a stock runsc
// does: its usage, exit status 128) or lists other edits fails the check,
// naming the binary; aenv's build passes. (The real build is checked in
// TestWithoutGofer.)
func TestRequireEdit(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, script string
		ok           bool
	}{
		{"stock", "echo 'Usage: runsc <flags> <subcommand> <subcommand args>' >&2; exit 128", false},
		{"older", "echo other-edit", false},
		{"aenv", "printf 'other-edit\\ngoferless-filestore\\n'", true},
	} {
		path := filepath.Join(dir, tt.name)
		if err := os.WriteFile(path, []byte("#!/bin/sh\n[ \"$*\" = aenv-edits ] || exit 3\n"+tt.script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		err := requireEdit(path, goferlessEdit)
		if (err == nil) != tt.ok {
			t.Errorf("%s: requireEdit = %v, want ok %v", tt.name, err, tt.ok)
		}
		if err != nil && !strings.Contains(err.Error(), path) {
			t.Errorf("%s: the error does not name the binary: %v", tt.name, err)
		}
	}
}

// TestNewPrunesToolsImages: a driver starting over a state directory
// removes the /.aenv images no sandbox's spec mounts (and an image tree
// left half made), keeps the one a sandbox kept over the restart runs
// with, and keeps all of them when a spec cannot be read. It needs no
// root: the driver runs over a fake cgroup tree and starts no sandbox.
func TestNewPrunesToolsImages(t *testing.T) {
	cg, _, exe := fakeHost(t)
	state := t.TempDir()
	images := filepath.Join(state, "images")
	used, old, tree := filepath.Join(images, "aenv-used.erofs"), filepath.Join(images, "aenv-old.erofs"), filepath.Join(images, "aenv-half.erofs.d")
	for _, dir := range []string{tree, filepath.Join(state, "sandboxes", "kept")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{used, old, filepath.Join(tree, "envd")} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	spec := filepath.Join(state, "sandboxes", "kept", "config.json")
	imagesDir := ""
	start := func(specJSON string) {
		t.Helper()
		if err := os.WriteFile(spec, []byte(specJSON), 0o600); err != nil {
			t.Fatal(err)
		}
		d, err := New(Config{RunscPath: exe, StateDir: state, ImagesDir: imagesDir, Cgroups: cg, PidsTotal: 100, CgroupParent: "/aenvprune", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }

	start(`{"mounts": [{"destination": "/.aenv", "type": "erofs", "source": "` + used + `"}`)
	if !exists(used) || !exists(old) || !exists(tree) {
		t.Fatalf("images removed though a spec could not be read: used %v, old %v, tree %v", exists(used), exists(old), exists(tree))
	}
	start(`{"mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}, {"destination": "/.aenv", "type": "erofs", "source": "` + used + `"}]}`)
	if !exists(used) {
		t.Error("the image a kept sandbox runs with was removed")
	}
	if exists(old) || exists(tree) {
		t.Errorf("unused images kept: old %v, half-made tree %v", exists(old), exists(tree))
	}

	// With an images directory of its own, the state directory's goes as
	// its sandboxes stop using it.
	imagesDir = filepath.Join(t.TempDir(), "tools-images")
	unused := filepath.Join(imagesDir, "aenv-unused.erofs")
	for _, f := range []string{old, unused} {
		if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	start(`{"mounts": [{"destination": "/.aenv", "type": "erofs", "source": "` + used + `"}]}`)
	if !exists(used) || exists(old) || exists(unused) {
		t.Errorf("with Config.ImagesDir: used %v (want true), unused in the state directory %v, in the images directory %v (want false)", exists(used), exists(old), exists(unused))
	}
}

// TestSameToolsImage: a checkpoint records the /.aenv image its sandbox
// ran with, and keeps it; a restore against the same image passes, one
// against another build's image adopts the checkpoint's (one copy for
// all its restores), a checkpoint that predates the record passes, and
// one that records an image without keeping it fails with errOtherTools
// (before runsc dumps its state), as does one whose kept image is not
// the recorded one.
func TestSameToolsImage(t *testing.T) {
	dir, sandbox, saved := t.TempDir(), t.TempDir(), t.TempDir()
	image := func(name string, b byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte{b}, 4096), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	root, tools, upgraded := image("root", 1), image("tools", 2), image("upgraded", 3)
	identity := func(image string) string {
		id, err := blockimage.Identity(image)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	if err := sameToolsImage(saved, identity(upgraded)); err != nil {
		t.Fatalf("a checkpoint without the record: %v", err)
	}
	if err := noteRootImage(sandbox, runtime.Spec{Root: runtime.RootFS{Image: root}}, tools); err != nil {
		t.Fatal(err)
	}
	if err := markRootMode(sandbox, saved); err != nil {
		t.Fatal(err)
	}
	if err := sameToolsImage(saved, identity(tools)); err != nil {
		t.Errorf("the same /.aenv image: %v", err)
	}
	if err := sameToolsImage(saved, identity(upgraded)); !errors.Is(err, errOtherTools) {
		t.Errorf("another build's /.aenv image: %v, want errOtherTools", err)
	}
	kept, err := os.ReadFile(filepath.Join(saved, savedToolsImage))
	if err != nil || !bytes.Equal(kept, bytes.Repeat([]byte{2}, 4096)) {
		t.Fatalf("the checkpoint does not keep its /.aenv image: %v", err)
	}

	d := &Driver{cfg: Config{ImagesDir: filepath.Join(dir, "images")}, log: slog.New(slog.DiscardHandler)}
	adopted, err := d.adoptSavedTools(saved, "sb")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(adopted) != d.imagesDir() || identity(adopted) != identity(tools) {
		t.Errorf("adopted %s, want an image of the driver's of the checkpoint's identity", adopted)
	}
	// A second restore of it (a fork's sibling) takes the same image; a
	// later sandbox's checkpoint keeps it again.
	if again, err := d.adoptSavedTools(saved, "sb2"); err != nil || again != adopted {
		t.Errorf("adopting again: %s, %v, want %s", again, err, adopted)
	}
	resumed, resaved := t.TempDir(), t.TempDir()
	if err := noteRootImage(resumed, runtime.Spec{Root: runtime.RootFS{Image: root}}, adopted); err != nil {
		t.Fatal(err)
	}
	if err := markRootMode(resumed, resaved); err != nil {
		t.Fatal(err)
	}
	if got := identity(filepath.Join(resaved, savedToolsImage)); got != identity(tools) {
		t.Error("the checkpoint of a sandbox restored under an adopted image does not keep it")
	}

	if err := os.Remove(filepath.Join(saved, savedToolsImage)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.adoptSavedTools(saved, "sb3"); !errors.Is(err, errOtherTools) {
		t.Errorf("a checkpoint that does not keep its image: %v, want errOtherTools", err)
	}
	if err := os.Link(upgraded, filepath.Join(saved, savedToolsImage)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.adoptSavedTools(saved, "sb4"); err == nil || errors.Is(err, errOtherTools) {
		t.Errorf("a checkpoint keeping another image than it records: %v, want an error saying so", err)
	}
}
