package image

import (
	"context"
	"errors"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/aenvhq/aenv/internal/testutil"
)

// TestPullMaxBytes checks both bounds of PullOptions.MaxBytes: a layer
// that unpacks to more than the bound (a few KiB of gzip that inflate to
// 64 MiB) fails while it unpacks, and an image whose layers are over it
// as stored fails before anything is fetched.
func TestPullMaxBytes(t *testing.T) {
	reg := newRegistry(t, nil)
	bomb := imageOf(t, v1.Config{}, shellLayer(t), layer(t, []ent{file("zeros", strings.Repeat("\x00", 64<<20))}))
	ref := reg.push(t, "test/bomb:v1", bomb)
	s := newStore(t)

	_, err := pull(t, s, ref, "bomb", PullOptions{MaxBytes: 16 << 20})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "unpacked") {
		t.Fatalf("pull of an image that unpacks past the bound: %v", err)
	}
	assertNoTemplate(t, s, "bomb")
	assertNoStages(t, s)

	_, err = pull(t, s, ref, "bomb", PullOptions{MaxBytes: 64 << 10})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "as stored") {
		t.Fatalf("pull of an image stored past the bound: %v", err)
	}
	assertNoTemplate(t, s, "bomb")

	if _, err := pull(t, s, ref, "bomb", PullOptions{MaxBytes: 80 << 20}); err != nil {
		t.Fatalf("pull within the bound: %v", err)
	}

	// A sparse file's holes count: 2.5 KiB of layer that declare 64 MiB.
	sparse := imageOf(t, v1.Config{}, shellLayer(t),
		static.NewLayer(testutil.SparseTar(t, "sparse", 64<<20), types.OCIUncompressedLayer))
	ref = reg.push(t, "test/sparse:v1", sparse)
	_, err = pull(t, s, ref, "sparse", PullOptions{MaxBytes: 16 << 20})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "unpacked") {
		t.Fatalf("pull of an image with a sparse file past the bound: %v", err)
	}
	assertNoTemplate(t, s, "sparse")
}

// TestBudget: a budget fails past its bound and keeps failing, also when
// one count is near the int64 bound (a sparse file's declared size).
func TestBudget(t *testing.T) {
	b := &budget{max: 1 << 20, what: "unpacked"}
	if err := b.take(1 << 19); err != nil {
		t.Fatal(err)
	}
	if err := b.take(math.MaxInt64); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("taking MaxInt64 bytes of a 1 MiB budget: %v", err)
	}
	if err := b.take(1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a budget past its bound took more: %v", err)
	}
	var none *budget
	if err := none.take(math.MaxInt64); err != nil {
		t.Fatalf("no budget: %v", err)
	}
}

// TestPullPublicOnly checks that a client's pull reaches no registry on
// the server's own networks: refused before the pull (CheckClientRef) and
// at the connection (PublicOnly), while the operator's pull works.
func TestPullPublicOnly(t *testing.T) {
	reg := newRegistry(t, nil)
	ref := reg.push(t, "test/local:v1", markerImage(t, "local"))
	s := newStore(t)
	if _, err := pull(t, s, ref, "local", PullOptions{PublicOnly: true}); !errors.Is(err, ErrForbidden) {
		t.Fatalf("PublicOnly pull from a loopback registry: %v", err)
	}
	assertNoTemplate(t, s, "local")
	if _, err := pull(t, s, ref, "local", PullOptions{}); err != nil {
		t.Fatalf("operator's pull: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, bad := range []string{
		ref, "docker://" + ref, "localhost:5000/x:1", "10.1.2.3/x:1", "169.254.169.254/latest:1", "[::1]:5000/x:1",
		"oci:/var/lib/aenv", "docker-archive:/etc/passwd", "dir:/tmp",
	} {
		if err := CheckClientRef(ctx, bad); !errors.Is(err, ErrForbidden) {
			t.Errorf("CheckClientRef(%q) = %v, want ErrForbidden", bad, err)
		}
	}
	for _, ok := range []string{"8.8.8.8:5000/x/y:1", "[2001:4860:4860::8888]/x:1"} {
		if err := CheckClientRef(ctx, ok); err != nil {
			t.Errorf("CheckClientRef(%q) = %v", ok, err)
		}
	}
	if err := CheckClientRef(ctx, "UPPER/x"); !errors.Is(err, ErrBadReference) {
		t.Errorf("CheckClientRef of a bad reference: %v", err)
	}
}

func TestPublicAddr(t *testing.T) {
	for a, want := range map[string]bool{
		"8.8.8.8": true, "2001:4860:4860::8888": true, "203.0.113.9": true,
		"127.0.0.1": false, "10.0.0.1": false, "172.16.5.4": false, "192.168.1.1": false,
		"169.254.169.254": false, "100.64.0.1": false, "0.0.0.0": false, "::1": false,
		"fe80::1": false, "fd00::1": false, "::ffff:127.0.0.1": false, "224.0.0.1": false,
	} {
		if got := publicAddr(netip.MustParseAddr(a)); got != want {
			t.Errorf("publicAddr(%s) = %v, want %v", a, got, want)
		}
	}
}

// TestUnpackTo checks that an image unpacked into a caller's directory
// is the tree Pull would publish, with its configuration, and that
// nothing is published.
func TestUnpackTo(t *testing.T) {
	reg := newRegistry(t, nil)
	img := imageOf(t, v1.Config{Env: []string{"A=1"}, WorkingDir: "/w"}, shellLayer(t), layer(t, []ent{file("marker", "unpacked")}))
	ref := reg.push(t, "test/unpack:v1", img)
	root, scratch := filepath.Join(t.TempDir(), "root"), t.TempDir()
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	res, err := UnpackTo(context.Background(), ref, root, scratch, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "marker")); err != nil || string(b) != "unpacked" {
		t.Fatalf("marker: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/passwd")); err != nil {
		t.Fatalf("the tree was not made usable: %v", err)
	}
	if res.Layers != 2 || res.Config.WorkingDir != "/w" || len(res.Config.Env) != 1 || !strings.HasPrefix(res.Config.Digest, "sha256:") {
		t.Fatalf("result = %+v", res)
	}
	if _, err := UnpackTo(context.Background(), ref, t.TempDir(), scratch, PullOptions{MaxBytes: 1 << 10}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("UnpackTo past MaxBytes: %v", err)
	}
}
