package transfer

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// sources writes files of the given sizes under dir and returns them as
// sources, with their contents.
func sources(t *testing.T, dir string, sizes map[string]int) ([]Source, map[string][]byte) {
	t.Helper()
	var srcs []Source
	data := map[string][]byte{}
	for name, size := range sizes {
		b := make([]byte, size)
		rand.Read(b)
		p := filepath.Join(dir, filepath.Base(name))
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, Source{Name: name, Path: p})
		data[name] = b
	}
	return srcs, data
}

// relay sends srcs to r from what r has, writing at most budget bytes
// before it is cut (budget < 0: no cut), and returns the files described
// and whether the stream ran to its end.
func relay(t *testing.T, srcs []Source, r *Receiver, budget int) ([]File, bool) {
	t.Helper()
	have, err := r.Received()
	if err != nil {
		t.Fatal(err)
	}
	errCut := errors.New("cut")
	var files []File
	err = Send(context.Background(), srcs, have, func(p Part) error {
		if p.Done != nil {
			files = append(files, *p.Done)
			return nil
		}
		if budget >= 0 && len(p.Data) > budget {
			// The cut comes mid-chunk: part of it is written, as a
			// connection that drops while a request's body is read.
			if err := r.Write(p.File, p.Offset, p.Data[:budget]); err != nil {
				t.Fatal(err)
			}
			return errCut
		}
		budget -= len(p.Data)
		return r.Write(p.File, p.Offset, p.Data)
	})
	if err != nil && !errors.Is(err, errCut) {
		t.Fatal(err)
	}
	return files, err == nil
}

// TestTransferResumesAfterCuts: files sent to a receiver that is cut
// several times, mid-chunk, arrive whole after as many resumes, each
// sending only what the receiver lacks; they verify, and an empty file
// arrives too.
func TestTransferResumesAfterCuts(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	srcs, data := sources(t, src, map[string]int{
		"snapshot/pages.img": 3*ChunkSize + 12345, "snapshot/meta.json": 200, "snapshot/empty": 0, "template/image.erofs": ChunkSize,
	})
	r := NewReceiver(filepath.Join(dst, "in"))
	var files []File
	total := 0
	for _, b := range data {
		total += len(b)
	}
	attempts := 0
	for done := false; !done; attempts++ {
		if attempts > 10 {
			t.Fatal("the transfer did not finish in 10 attempts")
		}
		before, _ := r.Received()
		files, done = relay(t, srcs, r, ChunkSize+ChunkSize/2)
		after, _ := r.Received()
		if !done && sum(after) <= sum(before) {
			t.Fatalf("attempt %d made no progress: %v -> %v", attempts, before, after)
		}
	}
	if attempts < 3 {
		t.Fatalf("%d attempts for %d bytes with a cut every 1.5 chunks: the cuts did not happen", attempts, total)
	}
	if len(files) != len(srcs) {
		t.Fatalf("%d files described, want %d", len(files), len(srcs))
	}
	if err := r.Verify(files); err != nil {
		t.Fatal(err)
	}
	for name, want := range data {
		got, err := os.ReadFile(r.Path(name))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s: %d bytes received (%v), want %d", name, len(got), err, len(want))
		}
	}
}

func sum(m map[string]int64) int64 {
	var n int64
	for _, v := range m {
		n += v
	}
	return n
}

// TestVerifyDropsWhatDoesNotMatch: a received file whose bytes differ
// from the sender's fails the check and is removed (it starts afresh
// next time), a short one fails and is kept (a cut), a file not in the
// list is removed, and a second transfer then verifies.
func TestVerifyDropsWhatDoesNotMatch(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	srcs, _ := sources(t, src, map[string]int{"snapshot/a": 5000, "snapshot/b": 7000})
	r := NewReceiver(filepath.Join(dst, "in"))
	files, done := relay(t, srcs, r, -1)
	if !done {
		t.Fatal("an uncut transfer did not finish")
	}
	// a is corrupted in place, b cut short, and a stray file appears.
	must(t, os.WriteFile(r.Path("snapshot/a"), make([]byte, 5000), 0o600))
	must(t, os.Truncate(r.Path("snapshot/b"), 100))
	must(t, os.WriteFile(r.Path("snapshot/stray"), []byte("x"), 0o600))
	err := r.Verify(files)
	if !errors.Is(err, ErrMismatch) {
		t.Fatalf("verifying corrupt files: %v, want ErrMismatch", err)
	}
	have, _ := r.Received()
	if _, ok := have["snapshot/a"]; ok {
		t.Fatal("a file that failed its checksum was kept")
	}
	if have["snapshot/b"] != 100 {
		t.Fatalf("a short file: %d bytes kept, want its 100", have["snapshot/b"])
	}
	if _, ok := have["snapshot/stray"]; ok {
		t.Fatal("a file the sender did not list was kept")
	}
	files, done = relay(t, srcs, r, -1)
	if !done {
		t.Fatal("the second transfer did not finish")
	}
	if err := r.Verify(files); err != nil {
		t.Fatalf("after a second transfer: %v", err)
	}
}

// TestReceiverRefusesBadChunks: a chunk at the wrong offset (sent twice,
// or out of order) and names that would leave the receiver's directory
// are refused, and nothing is written for them.
func TestReceiverRefusesBadChunks(t *testing.T) {
	dst := t.TempDir()
	r := NewReceiver(filepath.Join(dst, "in"))
	must(t, r.Write("snapshot/f", 0, []byte("hello")))
	if err := r.Write("snapshot/f", 0, []byte("hello")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a chunk sent twice: %v, want ErrInvalid", err)
	}
	if err := r.Write("snapshot/f", 9, []byte("x")); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a chunk past the end: %v, want ErrInvalid", err)
	}
	for _, bad := range []string{"../f", "snapshot/../../f", "snapshot/", "other/f", "snapshot/a/b", "template/.hidden", "f"} {
		if err := r.Write(bad, 0, []byte("x")); !errors.Is(err, ErrInvalid) {
			t.Fatalf("name %q: %v, want ErrInvalid", bad, err)
		}
	}
	have, _ := r.Received()
	if len(have) != 1 || have["snapshot/f"] != 5 {
		t.Fatalf("received: %v", have)
	}
	if err := r.Verify([]File{{Name: "../x", Size: 1}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("verifying a bad name: %v", err)
	}
}

// TestSendFromPastTheEnd: an offset beyond the file (a receiver that holds
// more than the sender's file) sends nothing of it; the receiver's check
// then fails and drops it.
func TestSendFromPastTheEnd(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	srcs, _ := sources(t, src, map[string]int{"snapshot/a": 10})
	r := NewReceiver(filepath.Join(dst, "in"))
	must(t, r.Write("snapshot/a", 0, make([]byte, 20)))
	files, done := relay(t, srcs, r, -1)
	if !done || len(files) != 1 || files[0].Size != 10 {
		t.Fatalf("files %v done %v", files, done)
	}
	if err := r.Verify(files); !errors.Is(err, ErrMismatch) {
		t.Fatalf("a longer file received: %v, want ErrMismatch", err)
	}
	files, _ = relay(t, srcs, r, -1)
	if err := r.Verify(files); err != nil {
		t.Fatal(err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
