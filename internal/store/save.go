package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
)

// Save stores the files (name → local path) as snapshot id. parent, if not
// empty, names the snapshot this one derives from: it is recorded, and its
// chunks are taken as present without asking the backend. meta, if not
// empty, must be JSON; it is kept in the manifest as is.
//
// Only chunks the backend lacks are uploaded, and the manifest is written
// last: if Save fails or the process dies, snapshot id does not exist and
// every other snapshot is untouched (uploaded chunks wait for a retry or
// GC). The stats are filled in as far as Save got, even on error.
func (s *Repository) Save(ctx context.Context, id, parent string, files map[string]string, meta []byte) (*Manifest, SaveStats, error) {
	start := time.Now()
	m, st, err := s.save(ctx, id, parent, files, meta)
	st.Duration = time.Since(start)
	if err != nil {
		return nil, st, fmt.Errorf("saving snapshot %s to %s: %w", id, s.b, err)
	}
	s.log.Info("snapshot saved", "snapshot_id", id, "parent", parent, "store", s.b.String(),
		"bytes", st.Bytes, "chunks", st.ChunksTotal, "chunks_uploaded", st.ChunksUploaded,
		"bytes_uploaded", st.BytesUploaded, "files_reused", st.FilesReused, "duration", st.Duration)
	return m, st, nil
}

// saveRun is the state of one Save shared by its chunk workers.
type saveRun struct {
	s      *Repository
	parent map[string]struct{} // chunks the parent manifest references
	// linked are the files of several links this Save read, by index in
	// the manifest, to remember once their chunks are all stored.
	linked map[int]fileKey

	mu       sync.Mutex
	inflight map[string]*chunkCall // one upload per hash within this Save
	st       *SaveStats
}

type chunkCall struct {
	done chan struct{}
	err  error
}

func (s *Repository) save(ctx context.Context, id, parent string, files map[string]string, meta []byte) (*Manifest, SaveStats, error) {
	var st SaveStats
	if err := validID("snapshot id", id); err != nil {
		return nil, st, err
	}
	if parent != "" {
		if err := validID("parent id", parent); err != nil {
			return nil, st, err
		}
	}
	if len(meta) > 0 && !json.Valid(meta) {
		return nil, st, errors.New("metadata is not valid JSON")
	}
	names := make([]string, 0, len(files))
	for name := range files {
		if err := validID("file name", name); err != nil {
			return nil, st, err
		}
		names = append(names, name)
	}
	sort.Strings(names)

	switch ok, err := Exists(ctx, s.b, manifestKey(id)); {
	case err != nil:
		return nil, st, fmt.Errorf("checking for an existing manifest: %w", err)
	case ok:
		return nil, st, fmt.Errorf("snapshot %w", ErrExists)
	}
	if len(files) > 0 {
		end, err := s.beginSave(ctx, id)
		if err != nil {
			return nil, st, err
		}
		defer end()
	}

	run := &saveRun{s: s, parent: map[string]struct{}{}, linked: map[int]fileKey{}, inflight: map[string]*chunkCall{}, st: &st}
	if parent != "" {
		pm, err := s.readManifest(ctx, parent)
		if err != nil {
			return nil, st, fmt.Errorf("reading parent snapshot %s: %w", parent, err)
		}
		for _, f := range pm.Files {
			for _, c := range f.Chunks {
				run.parent[c.Hash] = struct{}{}
			}
		}
	}

	m := &Manifest{
		Version:   manifestVersion,
		ID:        id,
		Parent:    parent,
		ChunkSize: s.chunkSize,
		Files:     make([]FileEntry, len(names)),
	}
	if len(meta) > 0 {
		m.Meta = json.RawMessage(bytes.Clone(meta))
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(s.concurrency)
	var readErr error
	for i, name := range names {
		if readErr = run.readFile(gctx, g, i, &m.Files[i], name, files[name]); readErr != nil {
			break
		}
	}
	// A worker's error comes first: the reader only saw its cancellation.
	if err := g.Wait(); err != nil {
		return nil, st, err
	}
	if readErr != nil {
		return nil, st, readErr
	}
	for i, key := range run.linked {
		s.rememberLinked(key, m.Files[i].Chunks)
	}
	for _, f := range m.Files {
		m.Size += f.Size
	}
	st.Files = len(m.Files)
	st.Bytes = m.Size

	m.Created = time.Now().UTC()
	data, err := json.Marshal(m)
	if err != nil {
		return nil, st, err
	}
	if err := s.b.Put(ctx, manifestKey(id), bytes.NewReader(data), int64(len(data))); err != nil {
		return nil, st, fmt.Errorf("writing manifest: %w", err)
	}
	st.BytesUploaded += int64(len(data))
	return m, st, nil
}

// readFile cuts one file, the manifest's index-th, into chunks and hands
// each to a worker of g, which fills fe.Chunks[i]. It blocks while all
// workers are busy, which bounds the buffers in flight. A file of several
// links saved before unchanged is not read (Repository.linked).
func (r *saveRun) readFile(ctx context.Context, g *errgroup.Group, index int, fe *FileEntry, name, path string) error {
	s := r.s
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("reading file %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("reading file %s: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("reading file %s: %s is not a regular file", name, path)
	}
	size := fi.Size()
	*fe = FileEntry{Name: name, Size: size, Mode: uint32(fi.Mode().Perm())}
	if key, ok := linkedKey(fi); ok {
		if refs, ok := s.reuseLinked(key); ok {
			fe.Chunks = refs
			r.mu.Lock()
			r.st.ChunksTotal += len(refs)
			r.st.FilesReused++
			r.mu.Unlock()
			return nil
		}
		r.linked[index] = key
	}
	// Workers fill refs by index; it has room for the most chunks the
	// chunker can cut, and fe.Chunks is trimmed to the real count at the
	// end (workers never touch fe.Chunks itself).
	refs := make([]ChunkRef, maxChunks(size, s.chunkSize))
	ch := newChunker(f, s.chunkSize, s.cdc)
	n := 0
	for ; ; n++ {
		if err := ctx.Err(); err != nil {
			return err // a worker failed; g.Wait has its error
		}
		bp := s.bufs.Get().(*[]byte)
		buf, err := ch.next((*bp)[:0])
		if err == io.EOF {
			s.bufs.Put(bp)
			break
		}
		if err != nil {
			s.bufs.Put(bp)
			return fmt.Errorf("reading file %s: %w", name, err)
		}
		if n == len(refs) {
			s.bufs.Put(bp)
			return fmt.Errorf("reading file %s: file grew while being saved", name)
		}
		i := n
		g.Go(func() error {
			defer s.bufs.Put(bp)
			ref, err := r.storeChunk(ctx, buf)
			if err != nil {
				return fmt.Errorf("storing chunk %d of file %s: %w", i, name, err)
			}
			refs[i] = ref
			return nil
		})
	}
	if ch.total != size {
		return fmt.Errorf("reading file %s: file changed size while being saved", name)
	}
	fe.Chunks = refs[:n]
	r.mu.Lock()
	r.st.ChunksTotal += n
	r.mu.Unlock()
	return nil
}

// fileKey names a file's content as long as it is not rewritten: its
// inode, size and modification time.
type fileKey struct {
	dev, ino    uint64
	size, mtime int64
}

// linkedKey is fi's fileKey, where fi has several hard links.
func linkedKey(fi os.FileInfo) (fileKey, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Nlink < 2 {
		return fileKey{}, false
	}
	return fileKey{dev: uint64(st.Dev), ino: uint64(st.Ino), size: fi.Size(), mtime: fi.ModTime().UnixNano()}, true
}

// maxLinked bounds Repository.linked: a node's snapshots link a few
// /.aenv images (one per build of envd), not hundreds.
const maxLinked = 64

// rememberLinked records the chunks of the file key names.
func (s *Repository) rememberLinked(key fileKey, refs []ChunkRef) {
	s.linkedMu.Lock()
	defer s.linkedMu.Unlock()
	if len(s.linked) >= maxLinked {
		clear(s.linked)
	}
	s.linked[key] = slices.Clone(refs)
}

// reuseLinked returns the chunks of the file key names, if a Save read
// it before and the backend is known to hold every one of them since.
func (s *Repository) reuseLinked(key fileKey) ([]ChunkRef, bool) {
	s.linkedMu.Lock()
	refs, ok := s.linked[key]
	s.linkedMu.Unlock()
	if !ok {
		return nil, false
	}
	for _, c := range refs {
		if c.Hash != s.zeroHash(c.Size) && !s.isKnown(c.Hash) {
			return nil, false
		}
	}
	return slices.Clone(refs), true
}

// storeChunk makes sure data is in the backend (and the local cache) and
// returns its reference.
func (r *saveRun) storeChunk(ctx context.Context, data []byte) (ChunkRef, error) {
	s := r.s
	size := int64(len(data))
	if isZero(data) {
		r.mu.Lock()
		r.st.ChunksZero++
		r.mu.Unlock()
		return ChunkRef{Hash: s.zeroHash(size), Size: size}, nil
	}
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	ref := ChunkRef{Hash: hash, Size: size}
	if s.cache != nil && !s.cache.has(hash) {
		// The node's cache is written first, so that a restore here needs
		// no network even for chunks the backend already had.
		s.cache.put(hash, data)
	}
	if _, ok := r.parent[hash]; ok || s.isKnown(hash) {
		return ref, nil
	}

	r.mu.Lock()
	if c, ok := r.inflight[hash]; ok {
		r.mu.Unlock()
		select {
		case <-c.done:
			return ref, c.err
		case <-ctx.Done():
			return ref, ctx.Err()
		}
	}
	c := &chunkCall{done: make(chan struct{})}
	r.inflight[hash] = c
	r.mu.Unlock()
	defer close(c.done)

	c.err = r.upload(ctx, hash, data)
	return ref, c.err
}

func (r *saveRun) upload(ctx context.Context, hash string, data []byte) error {
	s := r.s
	key := chunkKey(hash)
	switch ok, err := Exists(ctx, s.b, key); {
	case err != nil:
		return err
	case ok:
		s.markKnown(hash)
		return nil
	}
	enc := s.encode(data)
	if err := s.b.Put(ctx, key, bytes.NewReader(enc), int64(len(enc))); err != nil {
		return err
	}
	s.markKnown(hash)
	r.mu.Lock()
	r.st.ChunksUploaded++
	r.st.BytesUploaded += int64(len(enc))
	r.mu.Unlock()
	return nil
}

// Codec bytes that start every stored chunk.
const (
	codecRaw  = 0
	codecZstd = 1
)

// encode returns data as stored: a codec byte, then the data, compressed
// when that saves at least 1/64 of it (random data and most already
// compressed data is stored raw, so restore need not decompress it).
func (s *Repository) encode(data []byte) []byte {
	if s.compression == CompressionZstd && !looksRandom(data) {
		out := make([]byte, 1, len(data)/2+64)
		out[0] = codecZstd
		out = s.enc.EncodeAll(data, out)
		if len(out)-1 < len(data)-len(data)/64 {
			return out
		}
	}
	out := make([]byte, 1+len(data))
	out[0] = codecRaw
	copy(out[1:], data)
	return out
}

// zeroHash returns the hash of size zero bytes; such chunks are never
// stored, and Restore leaves holes for them.
func (s *Repository) zeroHash(size int64) string {
	s.zeroMu.Lock()
	defer s.zeroMu.Unlock()
	if h, ok := s.zeroHashes[size]; ok {
		return h
	}
	sum := sha256.Sum256(make([]byte, size))
	h := hex.EncodeToString(sum[:])
	s.zeroHashes[size] = h
	return h
}

var zeroPage [64 << 10]byte

func isZero(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), len(zeroPage))
		if !bytes.Equal(b[:n], zeroPage[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// Sampling for looksRandom: samples of sampleSize bytes at sampleCount
// evenly spread offsets.
const (
	sampleSize  = 4096
	sampleCount = 16
	// randomBits is the order-0 entropy, in bits per byte, above which a
	// 4 KiB sample is taken as incompressible. Uniformly random bytes
	// measure about 7.95 over 4 KiB; text, code and page tables measure
	// well under 7.
	randomBits = 7.8
)

// looksRandom reports whether every sample of data has near-maximal byte
// entropy, in which case trying zstd on it would cost a full pass for
// nothing (already compressed or encrypted data). One sample that looks
// compressible is enough to try, so mixed chunks (such as memory pages
// that are partly zero) are still compressed.
func looksRandom(data []byte) bool {
	if len(data) < sampleSize*sampleCount {
		return false
	}
	step := (len(data) - sampleSize) / (sampleCount - 1)
	for i := range sampleCount {
		if entropy(data[i*step:i*step+sampleSize]) < randomBits {
			return false
		}
	}
	return true
}

// entropy returns the order-0 Shannon entropy of b in bits per byte.
func entropy(b []byte) float64 {
	var hist [256]int
	for _, c := range b {
		hist[c]++
	}
	n := float64(len(b))
	var h float64
	for _, k := range hist {
		if k > 0 {
			p := float64(k) / n
			h -= p * math.Log2(p)
		}
	}
	return h
}
