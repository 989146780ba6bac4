package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// Restore writes the files of snapshot id into destDir, creating it if
// needed. Chunks come from the local cache when it has them and from the
// backend otherwise; every chunk is verified against its hash, and a
// mismatch fails the restore with ErrCorrupt. Each file appears under its
// name only once complete (it is written under a temporary name and
// renamed; fsynced first only with Options.SyncRestore); on error no
// temporary file is left behind.
func (s *Repository) Restore(ctx context.Context, id, destDir string) error {
	start := time.Now()
	var st restoreStats
	if err := s.restore(ctx, id, destDir, &st); err != nil {
		return fmt.Errorf("restoring snapshot %s from %s into %s: %w", id, s.b, destDir, err)
	}
	s.log.Info("snapshot restored", "snapshot_id", id, "store", s.b.String(), "dir", destDir,
		"bytes", st.bytes, "chunks_cached", st.fromCache.Load(), "chunks_fetched", st.fromBackend.Load(),
		"bytes_fetched", st.bytesFetched.Load(), "duration", time.Since(start))
	return nil
}

type restoreStats struct {
	bytes        int64
	fromCache    atomic.Int64
	fromBackend  atomic.Int64
	bytesFetched atomic.Int64
}

func (s *Repository) restore(ctx context.Context, id, destDir string, st *restoreStats) (err error) {
	if err := validID("snapshot id", id); err != nil {
		return err
	}
	m, err := s.readManifest(ctx, id)
	if err != nil {
		return err
	}
	st.bytes = m.Size
	if err := os.MkdirAll(destDir, 0o755); err != nil {
		return err
	}
	temps := make([]*os.File, len(m.Files))
	defer func() {
		if err == nil {
			return
		}
		for _, f := range temps {
			if f != nil {
				f.Close()
				os.Remove(f.Name())
			}
		}
	}()
	for i, fe := range m.Files {
		f, err := os.CreateTemp(destDir, ".restore-"+fe.Name+"-*")
		if err != nil {
			return err
		}
		temps[i] = f
		// Truncating first leaves holes where zero chunks are skipped.
		if err := f.Truncate(fe.Size); err != nil {
			return fmt.Errorf("sizing file %s: %w", fe.Name, err)
		}
	}

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.concurrency)
	for i, fe := range m.Files {
		f := temps[i]
		var next int64
		for j, c := range fe.Chunks {
			off := next
			next += c.Size
			if c.Hash == s.zeroHash(c.Size) {
				continue
			}
			if gctx.Err() != nil {
				break
			}
			g.Go(func() error {
				if err := gctx.Err(); err != nil {
					return err
				}
				data, err := s.fetchChunk(gctx, c, st)
				if err != nil {
					return fmt.Errorf("chunk %d of file %s: %w", j, fe.Name, err)
				}
				if _, err := f.WriteAt(data, off); err != nil {
					return fmt.Errorf("writing file %s: %w", fe.Name, err)
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for i, fe := range m.Files {
		f := temps[i]
		if err := f.Chmod(os.FileMode(fe.Mode).Perm()); err != nil {
			return fmt.Errorf("writing file %s: %w", fe.Name, err)
		}
		if !s.syncRestore {
			continue
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("writing file %s: %w", fe.Name, err)
		}
	}
	for i, fe := range m.Files {
		f := temps[i]
		if err := f.Close(); err != nil {
			return fmt.Errorf("writing file %s: %w", fe.Name, err)
		}
		if err := os.Rename(f.Name(), filepath.Join(destDir, fe.Name)); err != nil {
			return fmt.Errorf("writing file %s: %w", fe.Name, err)
		}
		temps[i] = nil
	}
	if !s.syncRestore {
		return nil
	}
	return syncDir(destDir)
}

// fetchChunk returns the verified content of c, from the cache if it holds
// a good copy, else from the backend (and then caches it).
func (s *Repository) fetchChunk(ctx context.Context, c ChunkRef, st *restoreStats) ([]byte, error) {
	if s.cache != nil {
		if data, ok := s.cache.get(c.Hash); ok {
			if verify(data, c) == nil {
				s.hits.Add(1)
				st.fromCache.Add(1)
				return data, nil
			}
			s.cache.forget(c.Hash) // torn or damaged: refetch
		}
	}
	// Only chunks that shrink are stored compressed, so a stored chunk is
	// at most its codec byte larger than its content.
	if s.cache != nil {
		s.misses.Add(1)
	}
	enc, err := getAll(ctx, s.b, chunkKey(c.Hash), c.Size+1)
	if err != nil {
		return nil, err
	}
	st.fromBackend.Add(1)
	st.bytesFetched.Add(int64(len(enc)))
	data, err := s.decode(enc, c)
	if err != nil {
		return nil, fmt.Errorf("chunk %s in %s: %w", c.Hash, s.b, err)
	}
	if err := verify(data, c); err != nil {
		return nil, fmt.Errorf("chunk %s in %s: %w", c.Hash, s.b, err)
	}
	if s.cache != nil {
		s.cache.put(c.Hash, data)
	}
	return data, nil
}

func (s *Repository) decode(enc []byte, c ChunkRef) ([]byte, error) {
	if len(enc) == 0 {
		return nil, fmt.Errorf("%w: empty object", ErrCorrupt)
	}
	switch enc[0] {
	case codecRaw:
		return enc[1:], nil
	case codecZstd:
		data, err := s.dec.DecodeAll(enc[1:], make([]byte, 0, c.Size))
		if err != nil {
			return nil, fmt.Errorf("%w: decompressing: %w", ErrCorrupt, err)
		}
		return data, nil
	default:
		return nil, fmt.Errorf("%w: unknown codec %d", ErrCorrupt, enc[0])
	}
}

func verify(data []byte, c ChunkRef) error {
	if int64(len(data)) != c.Size {
		return fmt.Errorf("%w: %d bytes, want %d", ErrCorrupt, len(data), c.Size)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != c.Hash {
		return fmt.Errorf("%w: content hashes to %s", ErrCorrupt, got)
	}
	return nil
}

// getAll reads a whole object of at most limit bytes.
func getAll(ctx context.Context, b Backend, key string, limit int64) ([]byte, error) {
	rc, err := b.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	var buf bytes.Buffer
	if limit <= 64<<20 {
		buf.Grow(int(limit) + bytes.MinRead)
	}
	if _, err := buf.ReadFrom(io.LimitReader(rc, limit+1)); err != nil {
		return nil, fmt.Errorf("reading %s from %s: %w", key, b, err)
	}
	if int64(buf.Len()) > limit {
		return nil, fmt.Errorf("reading %s from %s: %w: object larger than %d bytes", key, b, ErrCorrupt, limit)
	}
	return buf.Bytes(), nil
}

// forEach runs fn(0..n-1) with at most limit in flight; the first error
// cancels the rest and is returned.
func forEach(ctx context.Context, limit, n int, fn func(ctx context.Context, i int) error) error {
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(limit)
	for i := range n {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error { return fn(gctx, i) })
	}
	return g.Wait()
}
