package store

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatedBackend blocks the first Stat of a chunk until released, so that a
// test can hold a Save in flight.
type gatedBackend struct {
	Backend
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (g *gatedBackend) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if strings.HasPrefix(key, "chunks/") {
		g.once.Do(func() {
			close(g.reached)
			<-g.release
		})
	}
	return g.Backend.Stat(ctx, key)
}

// listGatedBackend blocks the first List of chunks (a GC's sweep about to
// begin) until released.
type listGatedBackend struct {
	Backend
	once    sync.Once
	reached chan struct{}
	release chan struct{}
}

func (g *listGatedBackend) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if prefix == "chunks/" {
		g.once.Do(func() {
			close(g.reached)
			<-g.release
		})
	}
	return g.Backend.List(ctx, prefix)
}

// TestGCFencesSaves: chunks no manifest references yet, which a Save in
// flight found stored and relies on, survive a GC; a Save that begins
// while a GC runs waits for it and then checks the chunks again, so that
// its snapshot restores whole either way.
func TestGCFencesSaves(t *testing.T) {
	ctx := context.Background()
	data := randomBytes(21, 4*MiB)

	t.Run("save in flight", func(t *testing.T) {
		b := newLocalBackend(t)
		s := newStore(t, Options{Backend: b, ChunkSize: MiB, GCGrace: -1})
		// The chunks are stored, then unreferenced (their snapshot deleted).
		if _, _, err := s.Save(ctx, "old", "", writeFiles(t, map[string][]byte{"mem": data}), nil); err != nil {
			t.Fatal(err)
		}
		must(t, s.Delete(ctx, "old"))
		g := &gatedBackend{Backend: b, reached: make(chan struct{}), release: make(chan struct{})}
		saver := newStore(t, Options{Backend: g, ChunkSize: MiB})
		done := make(chan error, 1)
		go func() {
			_, _, err := saver.Save(ctx, "new", "", writeFiles(t, map[string][]byte{"mem": data}), nil)
			done <- err
		}()
		<-g.reached
		st, err := s.GC(ctx)
		if err != nil || st.Deferred != 1 || st.ChunksDeleted != 0 {
			t.Fatalf("GC with a save in flight = %+v, %v; want it deferred", st, err)
		}
		close(g.release)
		must(t, <-done)
		restoreEqual(t, newStore(t, Options{Backend: b}), "new", data)
		if st, err := s.GC(ctx); err != nil || st.Deferred != 0 || st.ChunksKept != 4 {
			t.Fatalf("GC once the save is done = %+v, %v", st, err)
		}
	})

	t.Run("gc in flight", func(t *testing.T) {
		b := newLocalBackend(t)
		saver := newStore(t, Options{Backend: b, ChunkSize: MiB})
		// The saver knows the chunks are stored (it saved them).
		if _, _, err := saver.Save(ctx, "old", "", writeFiles(t, map[string][]byte{"mem": data}), nil); err != nil {
			t.Fatal(err)
		}
		must(t, saver.Delete(ctx, "old"))
		g := &listGatedBackend{Backend: b, reached: make(chan struct{}), release: make(chan struct{})}
		gc := newStore(t, Options{Backend: g, ChunkSize: MiB, GCGrace: -1})
		gcDone := make(chan error, 1)
		go func() {
			st, err := gc.GC(ctx)
			if err == nil && st.ChunksDeleted != 4 {
				err = errors.New("the GC did not delete the unreferenced chunks")
			}
			gcDone <- err
		}()
		<-g.reached
		saveDone := make(chan error, 1)
		go func() {
			_, _, err := saver.Save(ctx, "new", "", writeFiles(t, map[string][]byte{"mem": data}), nil)
			saveDone <- err
		}()
		select {
		case err := <-saveDone:
			t.Fatalf("a save finished while a GC ran (%v): it must wait", err)
		case <-time.After(700 * time.Millisecond):
		}
		close(g.release)
		must(t, <-gcDone)
		must(t, <-saveDone)
		restoreEqual(t, newStore(t, Options{Backend: b}), "new", data)
	})
}

func restoreEqual(t *testing.T, s *Repository, id string, want []byte) {
	t.Helper()
	dir := t.TempDir()
	if err := s.Restore(context.Background(), id, dir); err != nil {
		t.Fatalf("restoring %s: %v", id, err)
	}
	got := readFile(t, dir+"/mem")
	if !bytes.Equal(got, want) {
		t.Fatalf("restored %s differs", id)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	return b
}
