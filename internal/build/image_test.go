package build

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

// busyboxLayout writes an OCI layout holding one busybox image tagged
// "v1" and returns its directory.
func busyboxLayout(t *testing.T) string {
	t.Helper()
	const bbPath = "/bin/busybox"
	f, err := elf.Open(bbPath)
	if err != nil {
		testutil.Unavailable(t, "busybox-static not installed: "+err.Error())
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			f.Close()
			testutil.Unavailable(t, bbPath+" is dynamically linked; install busybox-static")
		}
	}
	f.Close()
	bb, err := os.ReadFile(bbPath)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, n := range []string{"sh", "cp", "mkdir", "chown", "id", "cat", "rm", "dd", "head", "tail", "sleep", "nproc", "test", "echo"} {
		tw.WriteHeader(&tar.Header{Name: "bin/" + n, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	tw.Close()
	img, err := mutate.AppendLayers(empty.Image, static.NewLayer(buf.Bytes(), types.OCIUncompressedLayer))
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Env: []string{"PATH=/bin", "FROM_IMAGE=yes"}, Cmd: []string{"/bin/sh"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestBuildFromImage(t *testing.T) {
	store, host := testStore(t)
	ref := "oci:" + busyboxLayout(t) + ":v1"
	df, err := Parse(strings.NewReader("FROM " + ref + "\nENV MORE=1\nUSER user\nRUN echo $FROM_IMAGE $MORE $(id -u) > /home/user/made\n"))
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	if _, err := Run(context.Background(), df, Options{Steps: host, Store: store, Template: template.Template{ID: "fromimage"}, Log: &log}); err != nil {
		t.Fatalf("build: %v\nlog:\n%s", err, log.String())
	}
	tpl, err := store.Get("fromimage")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(tpl.RootFS, "home/user/made")); err != nil || string(b) != "yes 1 1000\n" {
		t.Fatalf("made = %q, %v\nlog:\n%s", b, err, log.String())
	}
	img := tpl.Image
	if img.Ref != ref || img.Digest == "" || img.User != "user" || !contains(img.Env, "FROM_IMAGE=yes") ||
		!contains(img.Env, "MORE=1") || len(img.Cmd) != 1 {
		t.Fatalf("image config = %+v", img)
	}
	list, _ := store.List()
	if len(list) != 2 {
		t.Fatalf("templates = %v (the pulled image's temporary template should be gone)", list)
	}
}
