package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// A GC must never delete a chunk a Save in flight relies on: one it
// uploaded (the manifest that refers to it comes last) or one it found
// already stored and did not upload again. The grace period covers the
// first case only. The second is fenced, as in Dekker's algorithm, with
// two kinds of objects every Store sharing the backend sees:
//
//	pending/<save>   written by a Save before it looks at any chunk,
//	                 deleted once its manifest is written
//	gc/state         written by GC: running, then done, with a
//	                 generation that grows with every GC
//
// GC marks itself running, then lists pending saves: if there is any, it
// deletes nothing (it says so, and the next GC tries again). A Save writes
// its pending marker, then reads gc/state: if a GC is running, that GC
// listed the pending saves before this one's marker existed, so the Save
// waits for it to end. A Save that sees a new generation forgets which
// chunks it believed stored (they may be gone) and asks the backend again.
// Markers older than fenceStale are from processes that died and are
// ignored.

const (
	pendingPrefix = "pending/"
	gcStateKey    = "gc/state"
	// fenceStale is how long a marker counts: longer than any Save or GC.
	fenceStale = 2 * time.Hour
	// gcWait bounds how long a Save waits for a running GC.
	gcWait = 10 * time.Minute
)

type gcState struct {
	Running    bool      `json:"running"`
	Generation int64     `json:"generation"`
	At         time.Time `json:"at"`
}

func (s *Repository) readGCState(ctx context.Context) (gcState, error) {
	var st gcState
	b, err := getAll(ctx, s.b, gcStateKey, 4096)
	if errors.Is(err, ErrNotFound) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return gcState{}, nil // unreadable: treated as no GC
	}
	return st, nil
}

func (s *Repository) putJSON(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.b.Put(ctx, key, bytes.NewReader(b), int64(len(b)))
}

// beginSave registers a Save with the fence and returns what ends it.
func (s *Repository) beginSave(ctx context.Context, id string) (func(), error) {
	var nonce [6]byte
	rand.Read(nonce[:])
	key := pendingPrefix + id + "-" + hex.EncodeToString(nonce[:])
	if err := s.putJSON(ctx, key, map[string]any{"id": id, "at": time.Now().UTC()}); err != nil {
		return nil, fmt.Errorf("registering the save: %w", err)
	}
	end := func() { s.b.Delete(context.WithoutCancel(ctx), key) }
	deadline := time.Now().Add(gcWait)
	for {
		st, err := s.readGCState(ctx)
		if err != nil {
			end()
			return nil, fmt.Errorf("reading the garbage collector's state: %w", err)
		}
		if !st.Running || time.Since(st.At) > fenceStale {
			s.knownMu.Lock()
			if st.Generation != s.gcGeneration {
				clear(s.known)
				s.gcGeneration = st.Generation
			}
			s.knownMu.Unlock()
			return end, nil
		}
		if time.Now().After(deadline) {
			end()
			return nil, fmt.Errorf("a garbage collection of %s has been running since %s", s.b, st.At.Format(time.RFC3339))
		}
		select {
		case <-ctx.Done():
			end()
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// beginGC marks a GC running and reports the saves in flight (GC must
// then delete nothing); end marks it done.
func (s *Repository) beginGC(ctx context.Context) (pending int, end func(), err error) {
	st, err := s.readGCState(ctx)
	if err != nil {
		return 0, nil, err
	}
	st = gcState{Running: true, Generation: st.Generation + 1, At: time.Now().UTC()}
	if err := s.putJSON(ctx, gcStateKey, st); err != nil {
		return 0, nil, fmt.Errorf("marking the collection running: %w", err)
	}
	end = func() {
		done := st
		done.Running, done.At = false, time.Now().UTC()
		if err := s.putJSON(context.WithoutCancel(ctx), gcStateKey, done); err != nil {
			s.log.Warn("marking the garbage collection done", "store", s.b.String(), "err", err)
		}
	}
	marks, err := s.b.List(ctx, pendingPrefix)
	if err != nil {
		end()
		return 0, nil, fmt.Errorf("listing saves in flight: %w", err)
	}
	for _, m := range marks {
		if time.Since(m.ModTime) < fenceStale {
			pending++
		} else {
			s.b.Delete(ctx, m.Key) // left by a Save that died
		}
	}
	return pending, end, nil
}
