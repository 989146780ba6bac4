package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Defaults for Options fields left zero.
const (
	// DefaultChunkSize is large enough that per-object overhead (an S3
	// request, a HEAD) is small against the transfer, and small enough
	// that a 1 MiB change re-uploads only a few MiB.
	DefaultChunkSize     = 4 << 20
	DefaultConcurrency   = 8
	DefaultCacheMaxBytes = 8 << 30
	// DefaultGCGrace spares unreferenced chunks younger than this: a Save
	// in flight uploads its chunks before it writes the manifest that
	// references them.
	DefaultGCGrace = time.Hour
)

// Compression names how chunks are encoded in the backend.
type Compression string

// Compressions a Repository can write; it reads both whatever it is set to.
const (
	CompressionZstd Compression = "zstd"
	CompressionNone Compression = "none"
)

var (
	// ErrExists is returned by Save for an id that already has a manifest.
	ErrExists = errors.New("already exists")
	// ErrCorrupt classifies stored data that fails verification.
	ErrCorrupt = errors.New("checksum mismatch")
)

// Options configures a Repository.
type Options struct {
	// Backend holds chunks and manifests. Required.
	Backend Backend
	// CacheDir is the node's chunk cache; empty disables it.
	CacheDir string
	// CacheMaxBytes bounds the cache (default DefaultCacheMaxBytes).
	CacheMaxBytes int64
	// ChunkSize is the size files are cut into when saving (default
	// DefaultChunkSize). Restore follows each manifest's own chunk size, so
	// it can change between saves.
	ChunkSize int64
	// Concurrency bounds chunk uploads/downloads in flight, and so memory:
	// about 2*Concurrency*ChunkSize bytes during a Save or Restore.
	Concurrency int
	// ContentDefined cuts chunks where the content says, at page
	// boundaries, instead of every ChunkSize bytes (which is then the
	// maximum); see chunker.go. Use it for memory images.
	ContentDefined bool
	// Compression for new chunks (default zstd). Chunks that do not shrink
	// are stored raw either way.
	Compression Compression
	// GCGrace: GC never deletes a chunk younger than this. Zero means
	// DefaultGCGrace; negative means no grace (only safe when no Save runs
	// during GC).
	GCGrace time.Duration
	// SyncRestore makes Restore fsync each file before renaming it into
	// place. Off by default: restored files are read at once by runsc, and
	// after a host crash a restore is redone from the store rather than
	// trusted, so the fsync (about as slow as the rest of a local restore)
	// buys nothing.
	SyncRestore bool
	// Logger receives one line per Save, Restore, Delete and GC (default:
	// discard).
	Logger *slog.Logger
}

// Repository is a content-addressed snapshot store. Objects in the backend:
//
//	chunks/<sha256[:2]>/<sha256>   one chunk: a codec byte, then the data
//	snapshots/<id>/manifest.json   a snapshot, written last
//
// A snapshot exists exactly when its manifest does. A Repository is safe
// for concurrent use; several (on several nodes) may share a backend.
type Repository struct {
	b           Backend
	chunkSize   int64
	cdc         bool
	concurrency int
	compression Compression
	gcGrace     time.Duration
	syncRestore bool
	log         *slog.Logger
	cache       *chunkCache // nil when disabled
	enc         *zstd.Encoder
	dec         *zstd.Decoder
	bufs        sync.Pool // *[]byte of chunkSize capacity

	// known holds hashes of chunks this Store has seen in the backend, so
	// that a Save skips the HEAD for them. Another node's GC could delete a
	// chunk behind our back only if no manifest referenced it; see GC.
	knownMu sync.Mutex
	known   map[string]struct{}
	// gcGeneration is the last GC known is valid after (see fence.go).
	gcGeneration int64

	// linked remembers the chunks of files with several hard links that a
	// Save read, by inode and modification time: such a file is the same
	// content kept by several snapshots (each checkpoint of a sandbox
	// without a gofer links its build's 9 MB /.aenv image), and reading
	// and hashing it again cost every pause ~35 ms of CPU. It is used only
	// while known holds all its chunks, so a GC since reads it again.
	linkedMu sync.Mutex
	linked   map[fileKey][]ChunkRef

	zeroMu     sync.Mutex
	zeroHashes map[int64]string

	// hits and misses count chunk reads the cache served or not.
	hits, misses atomic.Int64
}

// New returns a Repository over opts.Backend.
func New(opts Options) (*Repository, error) {
	if opts.Backend == nil {
		return nil, errors.New("creating snapshot store: no backend")
	}
	s := &Repository{
		b:           opts.Backend,
		chunkSize:   opts.ChunkSize,
		cdc:         opts.ContentDefined,
		concurrency: opts.Concurrency,
		compression: opts.Compression,
		gcGrace:     opts.GCGrace,
		syncRestore: opts.SyncRestore,
		log:         opts.Logger,
		known:       map[string]struct{}{},
		linked:      map[fileKey][]ChunkRef{},
		zeroHashes:  map[int64]string{},
	}
	if s.chunkSize == 0 {
		s.chunkSize = DefaultChunkSize
	}
	if s.chunkSize < 4096 || s.chunkSize > 1<<30 {
		return nil, fmt.Errorf("creating snapshot store: chunk size %d out of range [4 KiB, 1 GiB]", s.chunkSize)
	}
	if s.concurrency <= 0 {
		s.concurrency = DefaultConcurrency
	}
	switch s.compression {
	case "":
		s.compression = CompressionZstd
	case CompressionZstd, CompressionNone:
	default:
		return nil, fmt.Errorf("creating snapshot store: unknown compression %q", s.compression)
	}
	if s.gcGrace == 0 {
		s.gcGrace = DefaultGCGrace
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	var err error
	s.enc, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest),
		zstd.WithEncoderConcurrency(s.concurrency))
	if err != nil {
		return nil, fmt.Errorf("creating snapshot store: %w", err)
	}
	s.dec, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(s.concurrency),
		zstd.WithDecoderMaxMemory(maxChunkSize))
	if err != nil {
		return nil, fmt.Errorf("creating snapshot store: %w", err)
	}
	if opts.CacheDir != "" {
		max := opts.CacheMaxBytes
		if max <= 0 {
			max = DefaultCacheMaxBytes
		}
		s.cache, err = openChunkCache(opts.CacheDir, max)
		if err != nil {
			s.dec.Close()
			return nil, fmt.Errorf("creating snapshot store: opening chunk cache %s: %w", opts.CacheDir, err)
		}
	}
	cs := int(s.chunkSize)
	s.bufs.New = func() any { b := make([]byte, cs); return &b }
	return s, nil
}

// Close releases the Store's decoders. The backend is the caller's.
func (s *Repository) Close() error {
	s.dec.Close()
	return s.enc.Close()
}

// maxChunkSize bounds what Restore accepts from a manifest.
const maxChunkSize = 1 << 30

// manifestVersion is bumped on incompatible manifest changes.
const manifestVersion = 1

// Manifest describes one snapshot.
type Manifest struct {
	Version int       `json:"version"`
	ID      string    `json:"id"`
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	// Size is the total size of the snapshot's files.
	Size      int64           `json:"size"`
	ChunkSize int64           `json:"chunk_size"`
	Files     []FileEntry     `json:"files"`
	Meta      json.RawMessage `json:"meta,omitempty"`
}

// FileEntry is one file of a snapshot: its chunks in order.
type FileEntry struct {
	Name   string     `json:"name"`
	Size   int64      `json:"size"`
	Mode   uint32     `json:"mode"`
	Chunks []ChunkRef `json:"chunks"`
}

// ChunkRef names one chunk by the sha256 of its uncompressed content.
// Chunks follow each other in file order; none exceeds the manifest's
// ChunkSize (see chunker.go for where they are cut).
type ChunkRef struct {
	Hash string `json:"hash"`
	Size int64  `json:"size"`
}

// File returns the entry named name, or nil.
func (m *Manifest) File(name string) *FileEntry {
	for i := range m.Files {
		if m.Files[i].Name == name {
			return &m.Files[i]
		}
	}
	return nil
}

// SaveStats tells what a Save moved, so that incremental behaviour can be
// measured.
type SaveStats struct {
	Files int
	// Bytes is the total size of the files saved.
	Bytes int64
	// ChunksTotal counts chunk positions in the manifest; ChunksUploaded
	// those sent to the backend, ChunksZero all-zero chunks (never stored),
	// and the rest were already there.
	ChunksTotal    int
	ChunksUploaded int
	ChunksZero     int
	// BytesUploaded is what went over the wire: encoded chunks plus the
	// manifest.
	BytesUploaded int64
	// FilesReused counts files not read again: saved before, unchanged,
	// with chunks known to be in the backend (see Repository.linked).
	FilesReused int
	Duration    time.Duration
}

var idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func validID(kind, id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("invalid %s %q (want 1-128 of [A-Za-z0-9._-], not starting with a punctuation mark)", kind, id)
	}
	return nil
}

func manifestKey(id string) string { return "snapshots/" + id + "/manifest.json" }

func chunkKey(hash string) string { return "chunks/" + hash[:2] + "/" + hash }

const manifestSuffix = "/manifest.json"

// Get returns the manifest of snapshot id; ErrNotFound if it has none.
func (s *Repository) Get(ctx context.Context, id string) (*Manifest, error) {
	if err := validID("snapshot id", id); err != nil {
		return nil, fmt.Errorf("getting snapshot: %w", err)
	}
	m, err := s.readManifest(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("getting snapshot %s: %w", id, err)
	}
	return m, nil
}

// maxManifestSize guards against reading a huge object as a manifest; a
// 1 TiB snapshot in 4 MiB chunks has a ~25 MiB manifest.
const maxManifestSize = 256 << 20

func (s *Repository) readManifest(ctx context.Context, id string) (*Manifest, error) {
	data, err := getAll(ctx, s.b, manifestKey(id), maxManifestSize)
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("decoding manifest: %w: %w", ErrCorrupt, err)
	}
	if m.Version != manifestVersion {
		return nil, fmt.Errorf("manifest version %d not supported (want %d)", m.Version, manifestVersion)
	}
	if m.ID != id {
		return nil, fmt.Errorf("manifest names snapshot %q: %w", m.ID, ErrCorrupt)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("manifest: %w: %w", ErrCorrupt, err)
	}
	return &m, nil
}

// check validates what Restore relies on, so that a damaged manifest is
// refused before anything is written.
func (m *Manifest) check() error {
	if m.ChunkSize <= 0 || m.ChunkSize > maxChunkSize {
		return fmt.Errorf("chunk size %d", m.ChunkSize)
	}
	var total int64
	seen := map[string]bool{}
	for _, f := range m.Files {
		if err := validID("file name", f.Name); err != nil {
			return err
		}
		if seen[f.Name] {
			return fmt.Errorf("file %s listed twice", f.Name)
		}
		seen[f.Name] = true
		var sum int64
		for i, c := range f.Chunks {
			if !isHash(c.Hash) {
				return fmt.Errorf("file %s chunk %d: bad hash %q", f.Name, i, c.Hash)
			}
			if c.Size <= 0 || c.Size > m.ChunkSize {
				return fmt.Errorf("file %s chunk %d: size %d", f.Name, i, c.Size)
			}
			sum += c.Size
		}
		if sum != f.Size {
			return fmt.Errorf("file %s: chunks add up to %d bytes, file has %d", f.Name, sum, f.Size)
		}
		total += f.Size
	}
	if total != m.Size {
		return fmt.Errorf("files add up to %d bytes, manifest says %d", total, m.Size)
	}
	return nil
}

// List returns every snapshot in the store, oldest first.
func (s *Repository) List(ctx context.Context) ([]*Manifest, error) {
	ms, err := s.listManifests(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing snapshots: %w", err)
	}
	return ms, nil
}

func (s *Repository) listManifests(ctx context.Context) ([]*Manifest, error) {
	objs, err := s.b.List(ctx, "snapshots/")
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, o := range objs {
		rest := strings.TrimPrefix(o.Key, "snapshots/")
		id, ok := strings.CutSuffix(rest, manifestSuffix)
		if ok && validID("", id) == nil {
			ids = append(ids, id)
		}
	}
	out := make([]*Manifest, len(ids))
	err = forEach(ctx, s.concurrency, len(ids), func(ctx context.Context, i int) error {
		m, err := s.readManifest(ctx, ids[i])
		if errors.Is(err, ErrNotFound) {
			return nil // deleted since the listing
		}
		if err != nil {
			return fmt.Errorf("reading snapshot %s: %w", ids[i], err)
		}
		out[i] = m
		return nil
	})
	if err != nil {
		return nil, err
	}
	ms := out[:0]
	for _, m := range out {
		if m != nil {
			ms = append(ms, m)
		}
	}
	sort.Slice(ms, func(i, j int) bool {
		if !ms[i].Created.Equal(ms[j].Created) {
			return ms[i].Created.Before(ms[j].Created)
		}
		return ms[i].ID < ms[j].ID
	})
	return ms, nil
}

// Delete removes snapshot id from the catalog. Its chunks stay until GC.
func (s *Repository) Delete(ctx context.Context, id string) error {
	if err := validID("snapshot id", id); err != nil {
		return fmt.Errorf("deleting snapshot: %w", err)
	}
	if _, err := s.b.Stat(ctx, manifestKey(id)); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	if err := s.b.Delete(ctx, manifestKey(id)); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", id, err)
	}
	s.log.Info("snapshot deleted", "snapshot_id", id, "store", s.b.String())
	return nil
}

// GCStats reports what a GC did.
type GCStats struct {
	Manifests     int
	ChunksKept    int
	ChunksDeleted int
	BytesDeleted  int64
	// ChunksSpared are unreferenced but younger than the grace period.
	ChunksSpared int
	// TempsRemoved counts files of interrupted writes the backend removed.
	TempsRemoved int
	// Deferred is the saves in flight that made the GC delete nothing.
	Deferred int
}

// staleTempRemover is implemented by backends whose interrupted writes
// leave files behind (Local); S3 discards a failed PutObject itself.
type staleTempRemover interface {
	RemoveStaleTemps(ctx context.Context, age time.Duration) (int, error)
}

// GC deletes chunks that no manifest references. It deletes nothing while
// a Save is in flight anywhere (see fence.go: a Save may rely on chunks no
// manifest references yet), lists chunks before manifests, and spares
// chunks younger than the grace period. Run GC from one node at a time.
func (s *Repository) GC(ctx context.Context) (GCStats, error) {
	var st GCStats
	start := time.Now()
	pending, end, err := s.beginGC(ctx)
	if err != nil {
		return st, fmt.Errorf("collecting garbage: %w", err)
	}
	defer end()
	if pending > 0 {
		st.Deferred = pending
		s.log.Info("snapshot store garbage collection deferred: saves in flight", "store", s.b.String(), "saves", pending)
		return st, nil
	}
	chunks, err := s.b.List(ctx, "chunks/")
	if err != nil {
		return st, fmt.Errorf("collecting garbage: listing chunks: %w", err)
	}
	// A manifest that cannot be read aborts the GC: sweeping on a partial
	// mark would delete live chunks.
	ms, err := s.listManifests(ctx)
	if err != nil {
		return st, fmt.Errorf("collecting garbage: reading manifests: %w", err)
	}
	st.Manifests = len(ms)
	live := map[string]struct{}{}
	for _, m := range ms {
		for _, f := range m.Files {
			for _, c := range f.Chunks {
				live[c.Hash] = struct{}{}
			}
		}
	}
	var doomed []ObjectInfo
	for _, o := range chunks {
		hash := o.Key[strings.LastIndexByte(o.Key, '/')+1:]
		if !isHash(hash) || o.Key != chunkKey(hash) {
			continue // not ours
		}
		switch _, ok := live[hash]; {
		case ok:
			st.ChunksKept++
		case s.gcGrace > 0 && start.Sub(o.ModTime) < s.gcGrace:
			st.ChunksSpared++
		default:
			doomed = append(doomed, o)
		}
	}
	var mu sync.Mutex
	err = forEach(ctx, s.concurrency, len(doomed), func(ctx context.Context, i int) error {
		hash := doomed[i].Key[strings.LastIndexByte(doomed[i].Key, '/')+1:]
		s.knownMu.Lock()
		delete(s.known, hash)
		s.knownMu.Unlock()
		if err := s.b.Delete(ctx, doomed[i].Key); err != nil {
			return err
		}
		mu.Lock()
		st.ChunksDeleted++
		st.BytesDeleted += doomed[i].Size
		mu.Unlock()
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("collecting garbage: %w", err)
	}
	if r, ok := s.b.(staleTempRemover); ok {
		st.TempsRemoved, err = r.RemoveStaleTemps(ctx, max(s.gcGrace, 0))
		if err != nil {
			return st, fmt.Errorf("collecting garbage: %w", err)
		}
	}
	s.log.Info("snapshot store garbage collected", "store", s.b.String(),
		"manifests", st.Manifests, "chunks_kept", st.ChunksKept, "chunks_deleted", st.ChunksDeleted,
		"bytes_deleted", st.BytesDeleted, "chunks_spared", st.ChunksSpared, "temps_removed", st.TempsRemoved, "duration", time.Since(start))
	return st, nil
}

func (s *Repository) isKnown(hash string) bool {
	s.knownMu.Lock()
	defer s.knownMu.Unlock()
	_, ok := s.known[hash]
	return ok
}

func (s *Repository) markKnown(hash string) {
	s.knownMu.Lock()
	s.known[hash] = struct{}{}
	s.knownMu.Unlock()
}
