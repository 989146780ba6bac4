package image

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/aenvhq/aenv/internal/template"
)

// The benchmark image: 4 layers of 5 files of 10 MiB of random
// (incompressible) bytes, plus the busybox layer.
const (
	benchLayers        = 4
	benchFilesPerLayer = 5
	benchFileSize      = 10 << 20
)

// benchImage is generated once per run, in a temporary directory, and
// served by one in-process registry; TestMain removes both.
var benchImage struct {
	once  sync.Once
	err   error
	dir   string
	srv   *httptest.Server
	ref   string
	blobs []string // URLs of the layer blobs
	size  int64    // bytes of all layer blobs
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchImage.srv != nil {
		benchImage.srv.Close()
	}
	if benchImage.dir != "" {
		os.RemoveAll(benchImage.dir)
	}
	os.Exit(code)
}

func setupBenchImage(b *testing.B) {
	b.Helper()
	shell := shellLayer(b) // skips (or fails in CI) without busybox
	benchImage.once.Do(func() { benchImage.err = buildBenchImage(shell) })
	if benchImage.err != nil {
		b.Fatal(benchImage.err)
	}
}

func buildBenchImage(shell v1.Layer) error {
	dir, err := os.MkdirTemp("", "aenv-bench-image-")
	if err != nil {
		return err
	}
	benchImage.dir = dir
	rng := rand.NewChaCha8([32]byte{1})
	layers := []v1.Layer{shell}
	buf := make([]byte, benchFileSize)
	for i := range benchLayers {
		p := filepath.Join(dir, fmt.Sprintf("layer-%d.tar.gz", i))
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
		tw := tar.NewWriter(zw)
		for j := range benchFilesPerLayer {
			rng.Read(buf)
			if err := tw.WriteHeader(&tar.Header{
				Name: fmt.Sprintf("data/%d/%d.bin", i, j), Typeflag: tar.TypeReg, Mode: 0o644,
				Size: int64(len(buf)), ModTime: epoch,
			}); err != nil {
				return err
			}
			if _, err := tw.Write(buf); err != nil {
				return err
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		l, err := tarball.LayerFromFile(p)
		if err != nil {
			return err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return err
	}

	benchImage.srv = httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	host := strings.TrimPrefix(benchImage.srv.URL, "http://")
	benchImage.ref = host + "/bench/img:v1"
	ref, err := name.ParseReference(benchImage.ref)
	if err != nil {
		return err
	}
	if err := remote.Write(ref, img); err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		benchImage.blobs = append(benchImage.blobs, benchImage.srv.URL+"/v2/bench/img/blobs/"+d.String())
		benchImage.size += size
	}
	return nil
}

// download fetches every layer blob of the benchmark image to io.Discard,
// one after the other: the floor a pull cannot beat.
func download() error {
	for _, u := range benchImage.blobs {
		resp, err := http.Get(u)
		if err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", u, resp.Status)
		}
	}
	return nil
}

// BenchmarkPull200MB pulls a ~200 MB image from an in-process registry
// ("pull": download, verify, decompress, unpack, flush, publish) beside
// the plain download of the same blobs ("download"). The pull reports
// x_download, its time over a download's measured in the same run.
func BenchmarkPull200MB(b *testing.B) {
	setupBenchImage(b)
	b.Run("download", func(b *testing.B) {
		b.SetBytes(benchImage.size)
		cpu0 := cpuTime()
		for b.Loop() {
			if err := download(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
	})
	b.Run("pull", func(b *testing.B) {
		s, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(b.TempDir(), "templates")})
		if err != nil {
			b.Fatal(err)
		}
		// The download this pull is compared with: best of three.
		var floor time.Duration
		for range 3 {
			start := time.Now()
			if err := download(); err != nil {
				b.Fatal(err)
			}
			if d := time.Since(start); floor == 0 || d < floor {
				floor = d
			}
		}
		b.SetBytes(benchImage.size)
		b.ResetTimer()
		var cpu time.Duration
		for i := 0; i < b.N; i++ {
			cpu0 := cpuTime()
			if _, err := Pull(context.Background(), benchImage.ref, PullOptions{
				Store: s, Template: template.Template{ID: "bench"},
			}); err != nil {
				b.Fatal(err)
			}
			cpu += cpuTime() - cpu0
			b.StopTimer()
			if err := os.RemoveAll(filepath.Join(storeDir(s), "bench")); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(floor), "x_download")
		b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
	})
}

// cpuTime is the CPU time this process has used, user and system: under
// a loaded machine a steadier measure of cost than wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
