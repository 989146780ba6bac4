package store

import (
	"bytes"
	"crypto/rand"
	"io"
	"testing"
)

func cut(t *testing.T, data []byte, cdc bool) [][]byte {
	t.Helper()
	c := newChunker(bytes.NewReader(data), 4<<20, cdc)
	var out [][]byte
	for {
		buf, err := c.next(make([]byte, 0, 4<<20))
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, buf)
	}
	if c.total != int64(len(data)) || !bytes.Equal(bytes.Join(out, nil), data) {
		t.Fatal("chunks do not add up to the input")
	}
	return out
}

// TestContentDefinedSurvivesShift inserts one page into a 32 MiB image
// (as a page allocated in gVisor's packed pages file does): content-defined
// chunks after the insertion are the same as before, fixed-size ones are
// not.
func TestContentDefinedSurvivesShift(t *testing.T) {
	a := make([]byte, 32<<20)
	rand.Read(a)
	page := make([]byte, pageSize)
	rand.Read(page)
	at := 5 << 20
	b := append(append(append([]byte{}, a[:at]...), page...), a[at:]...)

	newChunks := func(cdc bool) (int, int) {
		seen := map[string]bool{}
		for _, c := range cut(t, a, cdc) {
			seen[string(c)] = true
		}
		chunks := cut(t, b, cdc)
		n := 0
		for _, c := range chunks {
			if !seen[string(c)] {
				n++
			}
		}
		return n, len(chunks)
	}
	if n, total := newChunks(true); n > 2 {
		t.Fatalf("content-defined: %d of %d chunks changed after inserting one page", n, total)
	}
	if n, total := newChunks(false); n < total/2 {
		t.Fatalf("fixed-size: only %d of %d chunks changed; the test does not shift data", n, total)
	}
	for _, c := range cut(t, a, true) {
		if len(c) > 4<<20 {
			t.Fatalf("chunk of %d bytes exceeds the maximum", len(c))
		}
	}
}
