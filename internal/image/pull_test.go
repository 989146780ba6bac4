package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/testutil"
)

func pull(t *testing.T, s *template.Catalog, ref, id string, opts PullOptions) (*Result, error) {
	t.Helper()
	opts.Store = s
	opts.Template.ID = id
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return Pull(ctx, ref, opts)
}

// passwdLines are what Pull adds to an image without accounts.
const (
	addedPasswd = "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n"
	addedGroup  = "root:x:0:\nuser:x:1000:\n"
)

// accountTree is what Pull adds to a tree without accounts.
func accountTree() []string {
	return []string{
		"etc dir 0755 0:0",
		"etc/group file 0644 0:0 " + quote(addedGroup),
		"etc/passwd file 0644 0:0 " + quote(addedPasswd),
		"home dir 0755 0:0",
		"home/user dir 0755 1000:1000",
		"root dir 0700 0:0",
	}
}

func busyboxTree(t testing.TB) []string {
	bb := sha4(busybox(t))
	return []string{
		"bin dir 0755 0:0",
		"bin/busybox file 0755 0:0 " + bb,
		"bin/cat link 0777 0:0 -> busybox",
		"bin/ls link 0777 0:0 -> busybox",
		"bin/sh link 0777 0:0 -> busybox",
	}
}

func TestPullFromRegistry(t *testing.T) {
	testutil.RequireRoot(t)
	bb := busybox(t)
	l1 := layer(t, []ent{
		dir("etc/"),
		file("etc/os-release", "one\n"),
		dir("data/"),
		file("data/keep", "keep"),
		file("data/gone", "gone"),
		dir("data/dir/"),
		file("data/dir/sub", "sub"),
		dir("opq/"),
		file("opq/old", "old"),
		dir("opq/olddir/"),
		file("opq/olddir/x", "x"),
		{name: "owned", typ: tar.TypeReg, mode: 0o640, uid: 123, gid: 456, body: []byte("o")},
		{name: "suid", typ: tar.TypeReg, mode: 0o4755, body: []byte("s")},
		file("tmpfile", "t"),
		hardlink("bin/hardbb", "bin/busybox"),
		{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600},
		{name: "devices/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		dir("newdir/"),
		file("newdir/inner", "in"),
		symlink("varrun", "/run2"),
	})
	l2 := layer(t, []ent{
		file("data/.wh.gone", ""),
		file("data/.wh.dir", ""),
		dir("opq/"),
		// Before the marker: made by this layer, so it stays.
		file("opq/new", "new"),
		file("opq/.wh..wh..opq", ""),
		file("etc/os-release", "two\n"),
		file("implicit/deep/file", "f"),
		symlink("link-abs", "/etc/os-release"),
		// Through a dangling absolute link: lands in /run2.
		file("varrun/pid", "1"),
	}, tarball.WithCompression(compression.ZStd))
	l3 := plainLayer(t,
		file("newdir", "now a file"),
		file(".wh.tmpfile", ""),
	)
	cfg := v1.Config{
		Env:        []string{"PATH=/bin", "FOO=bar"},
		WorkingDir: "/data",
		User:       "1000",
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{"echo hi"},
	}
	img := imageOf(t, cfg, shellLayer(t), l1, l2, l3)
	reg := newRegistry(t, nil)
	ref := reg.push(t, "test/multi:v1", img)
	digest, _ := img.Digest()

	s := newStore(t)
	var mu sync.Mutex
	var events []Progress
	res, err := pull(t, s, "docker://"+ref, "multi", PullOptions{
		Template: template.Template{CPUCount: 1, MemoryMB: 256, StartCmd: "serve", ReadyCmd: "true"},
		Progress: func(p Progress) {
			mu.Lock()
			events = append(events, p)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Digest != digest.String() || res.Layers != 4 {
		t.Fatalf("result = %+v, want digest %s and 4 layers", res, digest)
	}

	want := append(busyboxTree(t), accountTree()...)
	want = append(want,
		"bin/busybox file 0755 0:0 "+sha4(bb)+" links=2",
		"bin/hardbb file 0755 0:0 "+sha4(bb)+" links=2",
		"data dir 0755 0:0",
		`data/keep file 0644 0:0 "keep"`,
		"devices dir 0755 0:0",
		"devices/null char 0666 0:0 1,3",
		`etc/os-release file 0644 0:0 "two\n"`,
		"implicit dir 0755 0:0",
		"implicit/deep dir 0755 0:0",
		`implicit/deep/file file 0644 0:0 "f"`,
		"link-abs link 0777 0:0 -> /etc/os-release",
		`newdir file 0644 0:0 "now a file"`,
		"opq dir 0755 0:0",
		`opq/new file 0644 0:0 "new"`,
		`owned file 0640 123:456 "o"`,
		"run dir 0755 0:0",
		"run/fifo fifo 0600 0:0",
		"run2 dir 0755 0:0",
		`run2/pid file 0644 0:0 "1"`,
		`suid file 4755 0:0 "s"`,
		"varrun link 0777 0:0 -> /run2",
	)
	// The hard link shows in the busybox line.
	want = remove(want, "bin/busybox file 0755 0:0 "+sha4(bb))
	assertTree(t, treeOf(t, res.Template.RootFS), want)

	st, err := os.Stat(filepath.Join(res.Template.RootFS, "etc/os-release"))
	if err != nil || !st.ModTime().Equal(epoch) {
		t.Errorf("etc/os-release mtime = %v, %v; want %v", st.ModTime(), err, epoch)
	}

	got, err := s.Get("multi")
	if err != nil {
		t.Fatal(err)
	}
	im := got.Image
	if got.CPUCount != 1 || got.MemoryMB != 256 || got.StartCmd != "serve" || got.ReadyCmd != "true" || im == nil {
		t.Fatalf("template = %+v", got)
	}
	if im.Ref != "docker://"+ref || im.Digest != digest.String() || im.WorkingDir != "/data" || im.User != "1000" ||
		strings.Join(im.Env, ",") != "PATH=/bin,FOO=bar" || strings.Join(im.Entrypoint, " ") != "/bin/sh -c" || strings.Join(im.Cmd, " ") != "echo hi" {
		t.Fatalf("image config = %+v", im)
	}
	assertNoStages(t, s)

	// Progress: every layer announced with nothing done, then counted to
	// its size and unpacked.
	mu.Lock()
	defer mu.Unlock()
	for i := 0; i < 4; i++ {
		if e := events[i]; e.Layer != i || e.Layers != 4 || e.Fetched != 0 || e.Applied != 0 || e.Total <= 0 {
			t.Fatalf("announcement %d = %+v", i, e)
		}
	}
	last := events[len(events)-1]
	if last.ImageFetched != last.ImageTotal || last.ImageApplied != last.ImageTotal || last.ImageFetched != res.Bytes {
		t.Fatalf("last event %+v, result bytes %d", last, res.Bytes)
	}
	unpacked := map[int]bool{}
	for _, e := range events {
		if e.Unpacked {
			if e.Fetched != e.Total || e.Applied != e.Total {
				t.Errorf("layer %d unpacked with %d fetched and %d applied of %d bytes", e.Layer, e.Fetched, e.Applied, e.Total)
			}
			unpacked[e.Layer] = true
		}
	}
	if len(unpacked) != 4 {
		t.Fatalf("unpacked layers: %v", unpacked)
	}
}

func remove(list []string, s string) []string {
	var out []string
	for _, l := range list {
		if l != s {
			out = append(out, l)
		}
	}
	return out
}

// quote is how treeOf shows content.
func quote(s string) string {
	if len(s) > 80 {
		return sha4([]byte(s))
	}
	return fmt.Sprintf("%q", s)
}

// markerImage is a busybox image with /marker holding s.
func markerImage(t *testing.T, s string) v1.Image {
	return imageOf(t, v1.Config{}, shellLayer(t), layer(t, []ent{file("marker", s)}))
}

func marker(t *testing.T, s *template.Catalog, id string) string {
	t.Helper()
	tpl, err := s.Get(id)
	if err != nil {
		t.Fatalf("template %s: %v", id, err)
	}
	b, err := os.ReadFile(filepath.Join(tpl.RootFS, "marker"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPullPicksLinuxAmd64(t *testing.T) {
	testutil.RequireRoot(t)
	arm := markerImage(t, "arm")
	amd := markerImage(t, "amd")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	reg := newRegistry(t, nil)
	ref := reg.host + "/test/multiarch:latest"
	if err := remote.WriteIndex(mustRef(t, ref), idx); err != nil {
		t.Fatal(err)
	}
	s := newStore(t)
	res, err := pull(t, s, ref, "multiarch", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := marker(t, s, "multiarch"); got != "amd" {
		t.Fatalf("pulled the %q image", got)
	}
	amdDigest, _ := amd.Digest()
	if res.Digest != amdDigest.String() {
		t.Fatalf("digest %s, want the amd64 image's %s", res.Digest, amdDigest)
	}

	armOnly := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	ref2 := reg.host + "/test/armonly:latest"
	if err := remote.WriteIndex(mustRef(t, ref2), armOnly); err != nil {
		t.Fatal(err)
	}
	_, err = pull(t, s, ref2, "armonly", PullOptions{})
	if !errors.Is(err, ErrPlatform) || !strings.Contains(err.Error(), "linux/arm64") {
		t.Fatalf("arm-only pull: %v", err)
	}
	assertNoTemplate(t, s, "armonly")
}

func TestPullOCILayout(t *testing.T) {
	testutil.RequireRoot(t)
	dirPath := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dirPath, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	for _, tag := range []string{"v1", "v2"} {
		if err := p.AppendImage(markerImage(t, tag), layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": tag,
		})); err != nil {
			t.Fatal(err)
		}
	}
	s := newStore(t)
	if _, err := pull(t, s, "oci:"+dirPath+":v2", "fromlayout", PullOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := marker(t, s, "fromlayout"); got != "v2" {
		t.Fatalf("marker = %q", got)
	}
	assertTree(t, treeOf(t, filepath.Join(storeDir(s), "fromlayout", "rootfs")),
		append(append(busyboxTree(t), accountTree()...), `marker file 0644 0:0 "v2"`))

	_, err = pull(t, s, "oci:"+dirPath, "ambiguous", PullOptions{})
	if !errors.Is(err, ErrBadReference) || !strings.Contains(err.Error(), "v1, v2") {
		t.Fatalf("untagged pull of a two-image layout: %v", err)
	}
	_, err = pull(t, s, "oci:"+dirPath+":nope", "nope", PullOptions{})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown tag: %v", err)
	}
	_, err = pull(t, s, "oci:"+filepath.Join(t.TempDir(), "missing"), "missing", PullOptions{})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing layout: %v", err)
	}

	// A corrupt blob is caught by its digest and leaves no template.
	img := markerImage(t, "corrupt")
	p2, err := layout.Write(filepath.Join(t.TempDir(), "corrupt"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p2.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	layers, _ := img.Layers()
	d, _ := layers[1].Digest()
	blob := filepath.Join(string(p2), "blobs", d.Algorithm, d.Hex)
	b, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-9] ^= 0xff // in the gzip trailer: decompression still works
	if err := os.WriteFile(blob, b, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = pull(t, s, "oci:"+string(p2), "corrupt", PullOptions{})
	if err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("corrupt blob: %v", err)
	}
	assertNoTemplate(t, s, "corrupt")
}

func TestPullDockerArchive(t *testing.T) {
	testutil.RequireRoot(t)
	archive := filepath.Join(t.TempDir(), "img.tar")
	tag, err := name.NewTag("example.com/test/archived:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(archive, tag, markerImage(t, "archived")); err != nil {
		t.Fatal(err)
	}
	s := newStore(t)
	res, err := pull(t, s, "docker-archive:"+archive, "archived", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	assertTree(t, treeOf(t, res.Template.RootFS),
		append(append(busyboxTree(t), accountTree()...), `marker file 0644 0:0 "archived"`))
	if !strings.HasPrefix(res.Digest, "sha256:") {
		t.Fatalf("digest = %q", res.Digest)
	}

	// Naming the image, with the colons of its tag.
	if _, err := pull(t, s, "docker-archive:"+archive+":example.com/test/archived:v1", "named", PullOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = pull(t, s, "docker-archive:"+archive+":example.com/other:v1", "other", PullOptions{})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown image in archive: %v", err)
	}
	assertNoTemplate(t, s, "other")
}

func TestPullNoShell(t *testing.T) {
	testutil.RequireRoot(t)
	reg := newRegistry(t, nil)
	good := reg.push(t, "test/good:v1", markerImage(t, "good"))
	noShell := reg.push(t, "test/noshell:v1", imageOf(t, v1.Config{}, layer(t, []ent{
		file("marker", "bad"), dir("bin/"), file("bin/true", "not a shell"),
	})))
	s := newStore(t)
	if _, err := pull(t, s, good, "keep", PullOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := pull(t, s, noShell, "keep", PullOptions{})
	t.Logf("error: %v", err)
	if !errors.Is(err, ErrNoShell) {
		t.Fatalf("pull of an image without a shell: %v", err)
	}
	if !strings.HasSuffix(err.Error(), "image has no shell (/bin/sh): aenv runs commands with a shell; use an image that has one") ||
		strings.Contains(err.Error(), "\n") {
		t.Fatalf("error is not the one-line explanation: %q", err)
	}
	if got := marker(t, s, "keep"); got != "good" {
		t.Fatalf("the existing template was changed: marker %q", got)
	}
	assertNoStages(t, s)
	_, err = pull(t, s, noShell, "fresh", PullOptions{})
	if !errors.Is(err, ErrNoShell) {
		t.Fatal(err)
	}
	assertNoTemplate(t, s, "fresh")
}

func TestPullRefusesEscapes(t *testing.T) {
	testutil.RequireRoot(t)
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(base, "templates")})
	if err != nil {
		t.Fatal(err)
	}
	reg := newRegistry(t, nil)
	bad := map[string][]ent{
		"dotdot":       {file("../escape", "x")},
		"deep-dotdot":  {dir("a/"), file("a/../../escape", "x")},
		"link-dotdot":  {hardlink("hl", "../outside/secret")},
		"whiteout-up":  {file("a/.wh...", "")},
		"dotdot-dir":   {dir("../escape-dir/")},
		"abs-dotdot":   {file("/../escape", "x")},
		"escape-later": {file("ok", "ok"), file("sub/../../../escape", "x")},
	}
	for id, entries := range bad {
		ref := reg.push(t, "test/"+id+":v1", imageOf(t, v1.Config{}, shellLayer(t), layer(t, entries)))
		_, err := pull(t, s, ref, id, PullOptions{})
		if !errors.Is(err, ErrUnsafeLayer) {
			t.Errorf("%s: pull error %v, want ErrUnsafeLayer", id, err)
		}
		assertNoTemplate(t, s, id)
	}

	// Symbolic links may point anywhere, but what is written through them
	// stays in the tree: absolute targets are taken from the tree's root.
	links := layer(t, []ent{
		symlink("evil", outside),
		symlink("rel", strings.Repeat("../", 20)+strings.TrimPrefix(outside, "/")),
	})
	writes := layer(t, []ent{
		file("evil/pwned", "1"),
		file("rel/pwned2", "2"),
	})
	ref := reg.push(t, "test/links:v1", imageOf(t, v1.Config{}, shellLayer(t), links, writes))
	res, err := pull(t, s, ref, "links", PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"pwned", "pwned2"} {
		if _, err := os.Stat(filepath.Join(res.Template.RootFS, outside, f)); err != nil {
			t.Errorf("%s did not land inside the tree: %v", f, err)
		}
	}
	// A hard link through such a link finds nothing to link to.
	hl := layer(t, []ent{hardlink("stolen", "evil/secret")})
	ref = reg.push(t, "test/hardlink:v1", imageOf(t, v1.Config{}, shellLayer(t), links, hl))
	if _, err := pull(t, s, ref, "hardlink", PullOptions{}); err == nil {
		t.Error("a hard link to a file outside the tree was made")
	}
	assertNoTemplate(t, s, "hardlink")

	entries, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "secret" {
		t.Fatalf("outside directory changed: %v", entries)
	}
	if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "secret" {
		t.Fatalf("secret = %q, %v", b, err)
	}
	// Nothing named escape anywhere around the store.
	filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasPrefix(d.Name(), "escape") {
			t.Errorf("written outside the tree: %s", p)
		}
		return nil
	})
}

func TestPullUnreachable(t *testing.T) {
	s := newStore(t)
	start := time.Now()
	_, err := pull(t, s, "127.0.0.1:1/test/img:v1", "unreachable", PullOptions{})
	if !errors.Is(err, ErrUnreachable) || !strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("pull from a closed port: %v", err)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("took %v to give up", d)
	}
	assertNoTemplate(t, s, "unreachable")
}

func TestPullUnknownTag(t *testing.T) {
	reg := newRegistry(t, nil)
	reg.push(t, "test/img:v1", markerImage(t, "x"))
	s := newStore(t)
	for _, ref := range []string{reg.host + "/test/img:nope", reg.host + "/test/other:v1"} {
		_, err := pull(t, s, ref, "unknown", PullOptions{})
		t.Logf("error: %v", err)
		if !errors.Is(err, ErrNotFound) || strings.Contains(err.Error(), "\n") {
			t.Fatalf("pull of %s: %v", ref, err)
		}
	}
	assertNoTemplate(t, s, "unknown")
}

func TestPullBadReferences(t *testing.T) {
	s := newStore(t)
	for _, ref := range []string{"UPPER/Case:tag", "docker-daemon:busybox:latest", "oci-archive:/x.tar", "docker://", "a:b:c"} {
		_, err := pull(t, s, ref, "bad", PullOptions{})
		if !errors.Is(err, ErrBadReference) {
			t.Errorf("pull of %q: %v, want ErrBadReference", ref, err)
		}
	}
	for _, id := range []string{"Bad", "../x", "", "base"} {
		if _, err := pull(t, s, "busybox", id, PullOptions{}); err == nil {
			t.Errorf("template name %q accepted", id)
		}
	}
	assertNoStages(t, s)
}

// staticKeychain hands out one set of credentials.
type staticKeychain struct{ auth authn.Authenticator }

func (k staticKeychain) Resolve(authn.Resource) (authn.Authenticator, error) { return k.auth, nil }

func TestPullAuth(t *testing.T) {
	reg := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "alice" || p != "secret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	img := markerImage(t, "private")
	ref := reg.host + "/test/private:v1"
	if err := remote.Write(mustRef(t, ref), img, remote.WithAuth(&authn.Basic{Username: "alice", Password: "secret"})); err != nil {
		t.Fatal(err)
	}
	// The credentials in this host's docker config are the server
	// user's, not the operator's for the server: never used on their own.
	authFile := filepath.Join(t.TempDir(), "config.json")
	auths := fmt.Sprintf(`{"auths": {%q: {"auth": "YWxpY2U6c2VjcmV0"}}}`, reg.host) // alice:secret
	if err := os.WriteFile(authFile, []byte(auths), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DOCKER_CONFIG", filepath.Dir(authFile))
	s := newStore(t)
	_, err := pull(t, s, ref, "private", PullOptions{})
	t.Logf("error: %v", err)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "--registry-auth") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("anonymous pull: %v", err)
	}
	_, err = pull(t, s, ref, "private", PullOptions{Keychain: staticKeychain{&authn.Basic{Username: "alice", Password: "wrong"}}})
	if !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("pull with a wrong password: %v", err)
	}
	assertNoTemplate(t, s, "private")
	if _, err := pull(t, s, ref, "private", PullOptions{Keychain: staticKeychain{&authn.Basic{Username: "alice", Password: "secret"}}}); err != nil {
		t.Fatalf("pull with credentials: %v", err)
	}
	if got := marker(t, s, "private"); got != "private" {
		t.Fatalf("marker = %q", got)
	}
	// The same credentials, given as the operator's file.
	kc, err := LoadRegistryAuth(authFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pull(t, s, ref, "private2", PullOptions{Keychain: kc}); err != nil {
		t.Fatalf("pull with --registry-auth's credentials: %v", err)
	}
	other, err := LoadRegistryAuth(writeFile(t, `{"auths": {"elsewhere.example": {"auth": "YWxpY2U6c2VjcmV0"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pull(t, s, ref, "private3", PullOptions{Keychain: other}); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("credentials for another registry were used: %v", err)
	}
	if _, err := LoadRegistryAuth(writeFile(t, "{not json")); err == nil {
		t.Fatal("a malformed credentials file was accepted")
	}
}

// writeFile writes body to a new file and returns its path.
func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// cutWriter passes limit bytes of a response, then calls cut and hangs
// until the client goes away: a download interrupted mid-way.
type cutWriter struct {
	http.ResponseWriter
	ctx   context.Context
	limit int
	cut   func()
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) <= c.limit {
		c.limit -= len(p)
		return c.ResponseWriter.Write(p)
	}
	n, _ := c.ResponseWriter.Write(p[:c.limit])
	c.limit = 0
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	c.cut()
	<-c.ctx.Done()
	return n, c.ctx.Err()
}

func TestPullInterrupted(t *testing.T) {
	testutil.RequireRoot(t)
	big := make([]byte, 8<<20)
	rand.Read(big)
	img := imageOf(t, v1.Config{}, shellLayer(t),
		layer(t, []ent{file("marker", "new")}),
		layer(t, []ent{{name: "big", typ: tar.TypeReg, mode: 0o644, body: big}},
			tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching),
		layer(t, []ent{file("after", "a")}))
	layers, _ := img.Layers()
	bigDigest, _ := layers[2].Digest()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+bigDigest.String()) {
				w = &cutWriter{ResponseWriter: w, ctx: r.Context(), limit: 1 << 20, cut: cancel}
			}
			h.ServeHTTP(w, r)
		})
	})
	ref := reg.push(t, "test/big:v1", img)
	s := newStore(t)
	if _, err := pull(t, s, reg.push(t, "test/old:v1", markerImage(t, "old")), "keep", PullOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := Pull(ctx, ref, PullOptions{Store: s, Template: template.Template{ID: "keep"}})
	t.Logf("error: %v", err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted pull: %v", err)
	}
	if got := marker(t, s, "keep"); got != "old" {
		t.Fatalf("the existing template was changed: %q", got)
	}
	assertNoStages(t, s)
	_, err = Pull(ctx, ref, PullOptions{Store: s, Template: template.Template{ID: "fresh"}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("pull with a cancelled context: %v", err)
	}
	assertNoTemplate(t, s, "fresh")
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// abortWriter passes limit bytes of a response, then drops the
// connection: a registry or proxy that dies mid-blob.
type abortWriter struct {
	http.ResponseWriter
	limit int
}

func (a *abortWriter) Write(p []byte) (int, error) {
	if len(p) <= a.limit {
		a.limit -= len(p)
		return a.ResponseWriter.Write(p)
	}
	a.ResponseWriter.Write(p[:a.limit])
	if f, ok := a.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
	panic(http.ErrAbortHandler)
}

func TestPullTruncatedBlob(t *testing.T) {
	big := make([]byte, 4<<20)
	rand.Read(big)
	img := imageOf(t, v1.Config{}, shellLayer(t),
		layer(t, []ent{{name: "big", typ: tar.TypeReg, mode: 0o644, body: big}},
			tarball.WithCompressionLevel(gzip.BestSpeed), tarball.WithCompressedCaching))
	layers, _ := img.Layers()
	bigDigest, _ := layers[1].Digest()
	reg := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+bigDigest.String()) {
				w = &abortWriter{ResponseWriter: w, limit: 1 << 20}
			}
			h.ServeHTTP(w, r)
		})
	})
	ref := reg.push(t, "test/truncated:v1", img)
	s := newStore(t)
	_, err := pull(t, s, ref, "truncated", PullOptions{})
	if err == nil {
		t.Fatal("a truncated layer was accepted")
	}
	t.Logf("error: %v", err)
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error is not one line: %q", err)
	}
	assertNoTemplate(t, s, "truncated")
}
