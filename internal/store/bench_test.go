package store

import (
	"context"
	"fmt"
	"testing"
)

// The benchmarks move a 256 MiB file of random data (incompressible: the
// worst case for zstd, which then stores chunks raw) through each backend.
// Save uploads every chunk (a fresh prefix per iteration); Restore fetches
// every chunk from the backend (no cache) or reads the warm cache.

const benchSize = 256 << 20

func benchBackend(b *testing.B, kind string) Backend {
	if kind == "s3" {
		return newS3Backend(b)
	}
	return newLocalBackend(b)
}

func BenchmarkSave(b *testing.B) {
	files := writeFiles(b, map[string][]byte{"mem": randomBytes(30, benchSize)})
	for _, kind := range []string{"local", "s3"} {
		for _, comp := range []Compression{CompressionZstd, CompressionNone} {
			b.Run(fmt.Sprintf("%s/%s", kind, comp), func(b *testing.B) {
				b.SetBytes(benchSize)
				for i := 0; b.Loop(); i++ {
					s := newStore(b, Options{Backend: benchBackend(b, kind), Compression: comp})
					if _, _, err := s.Save(context.Background(), fmt.Sprint("s", i), "", files, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func BenchmarkRestore(b *testing.B) {
	files := writeFiles(b, map[string][]byte{"mem": randomBytes(31, benchSize)})
	for _, kind := range []string{"local", "s3"} {
		backend := benchBackend(b, kind)
		cacheDir := b.TempDir()
		saver := newStore(b, Options{Backend: backend, CacheDir: cacheDir})
		if _, _, err := saver.Save(context.Background(), "r", "", files, nil); err != nil {
			b.Fatal(err)
		}
		for _, cached := range []bool{false, true} {
			name := kind + "/backend"
			opts := Options{Backend: backend}
			if cached {
				name = kind + "/cache"
				opts.CacheDir = cacheDir
			}
			b.Run(name, func(b *testing.B) {
				s := newStore(b, opts)
				dest := b.TempDir()
				b.SetBytes(benchSize)
				for b.Loop() {
					if err := s.Restore(context.Background(), "r", dest); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// memoryLike builds n bytes shaped like a guest memory image, page by page:
// 40% zero pages, 30% random (already compressed or encrypted data), 30%
// repetitive (text, code, page tables).
func memoryLike(n int) []byte {
	const page = 4096
	out := make([]byte, n)
	rnd := randomBytes(32, n)
	text := []byte("GET /api/v1/sandboxes HTTP/1.1\r\nHost: localhost\r\nUser-Agent: agent/1.0 ")
	for off := 0; off+page <= n; off += page {
		switch p := (off / page * 7919) % 10; {
		case p < 4: // zero
		case p < 7:
			copy(out[off:off+page], rnd[off:off+page])
		default:
			for i := off; i < off+page; i += len(text) {
				copy(out[i:min(i+len(text), off+page)], text)
			}
			out[off+int(rnd[off])] = rnd[off+1] // not all pages identical
		}
	}
	return out
}

// BenchmarkSaveMemoryLike shows what compression buys on data shaped like
// a memory image; stored/raw is the fraction of bytes uploaded.
func BenchmarkSaveMemoryLike(b *testing.B) {
	files := writeFiles(b, map[string][]byte{"mem": memoryLike(benchSize)})
	for _, comp := range []Compression{CompressionZstd, CompressionNone} {
		b.Run(string(comp), func(b *testing.B) {
			b.SetBytes(benchSize)
			var st SaveStats
			for i := 0; b.Loop(); i++ {
				s := newStore(b, Options{Backend: newLocalBackend(b), Compression: comp})
				var err error
				if _, st, err = s.Save(context.Background(), fmt.Sprint("s", i), "", files, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(st.BytesUploaded)/benchSize, "stored/raw")
		})
	}
}
