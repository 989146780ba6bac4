package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// slowReader hands out a few bytes at a time, so that the spool's reader
// catches up with its writer again and again.
type slowReader struct{ r io.Reader }

func (s slowReader) Read(p []byte) (int, error) {
	if len(p) > 1000 {
		p = p[:1000]
	}
	return s.r.Read(p)
}

func TestSpool(t *testing.T) {
	data := make([]byte, 3<<20+123)
	rand.Read(data)
	for _, limit := range []int64{0, 1 << 20, 64 << 20} {
		// concurrently: the reader catches up with the writer again and
		// again; whether it spills depends on who is faster.
		for _, concurrently := range []bool{true, false} {
			path := filepath.Join(t.TempDir(), "spool")
			s := newSpool(path)
			s.limit = limit
			src := &layerSource{size: int64(len(data)), open: func(context.Context) (io.ReadCloser, error) {
				return io.NopCloser(slowReader{bytes.NewReader(data)}), nil
			}}
			var counted int64
			done := make(chan struct{})
			fill := func() {
				defer close(done)
				s.fill(context.Background(), src, func(n int64) error { counted += n; return nil })
			}
			if concurrently {
				go fill()
			} else {
				fill()
			}
			got, err := io.ReadAll(&spoolReader{s: s})
			<-done
			if err != nil || !bytes.Equal(got, data) || counted != int64(len(data)) {
				t.Fatalf("limit %d, concurrently %v: read %d bytes (equal %v), counted %d, err %v",
					limit, concurrently, len(got), bytes.Equal(got, data), counted, err)
			}
			_, statErr := os.Stat(path)
			if spilled := statErr == nil; !concurrently && spilled != (limit < int64(len(data))) {
				t.Errorf("limit %d: spill file exists = %v", limit, spilled)
			}
			s.remove()
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("limit %d: spill file left: %v", limit, err)
			}
		}
	}
}

func TestSpoolPassesErrors(t *testing.T) {
	boom := errors.New("connection reset")
	s := newSpool(filepath.Join(t.TempDir(), "spool"))
	src := &layerSource{open: func(context.Context) (io.ReadCloser, error) {
		return io.NopCloser(io.MultiReader(bytes.NewReader([]byte("partial")), errReader{boom})), nil
	}}
	go s.fill(context.Background(), src, func(int64) error { return nil })
	got, err := io.ReadAll(&spoolReader{s: s})
	if !errors.Is(err, boom) || string(got) != "partial" {
		t.Fatalf("read %q, %v", got, err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
