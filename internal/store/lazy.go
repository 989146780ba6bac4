package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"sync/atomic"
)

// LazyFile reads one file of a stored manifest on demand: only the chunks
// a read touches are fetched (each verified by its hash, kept in the
// store's bounded chunk cache), so that a large image serves a sandbox
// having fetched a small part of it. It is safe for concurrent use.
type LazyFile struct {
	s      *Repository
	id     string
	chunks []ChunkRef
	// offsets[i] is where chunk i starts; offsets[len] is the size.
	offsets []int64

	mu       sync.Mutex
	inflight map[int]*fetchCall
	// recent holds the last chunks read, decoded: a file system reads a
	// chunk in many small pieces, each of which would otherwise read and
	// hash the whole chunk again from the disk cache.
	recent     map[int][]byte
	recentList []int

	// Fetched counts chunks read from the backend (not the cache), and
	// FetchedBytes their size as stored; Hits counts chunks the local
	// cache served.
	Fetched, FetchedBytes, Hits atomic.Int64

	// ahead counts read-aheads in flight, for Close (not a WaitGroup:
	// reads start new ones while Close waits).
	aheadMu   sync.Mutex
	aheadN    int
	aheadIdle *sync.Cond

	// trace is the order chunks were first read in (see Trace).
	traceMu sync.Mutex
	trace   []int
	traced  map[int]bool
	// prev is the chunk the last read wanted.
	prev int
}

type fetchCall struct {
	done chan struct{}
	data []byte
	err  error
}

// ErrNoFile is returned when a manifest has no file of the name asked.
var ErrNoFile = errors.New("no such file in the manifest")

// OpenLazy opens file name of manifest id for reads on demand.
func (s *Repository) OpenLazy(ctx context.Context, id, name string) (*LazyFile, error) {
	m, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	fe := m.File(name)
	if fe == nil {
		return nil, fmt.Errorf("opening %s of %s: %w", name, id, ErrNoFile)
	}
	f := &LazyFile{s: s, id: id, chunks: fe.Chunks, offsets: make([]int64, len(fe.Chunks)+1), inflight: map[int]*fetchCall{},
		recent: map[int][]byte{}, traced: map[int]bool{}, prev: -2}
	f.aheadIdle = sync.NewCond(&f.aheadMu)
	for i, c := range fe.Chunks {
		f.offsets[i+1] = f.offsets[i] + c.Size
	}
	if f.offsets[len(fe.Chunks)] != fe.Size {
		return nil, fmt.Errorf("opening %s of %s: %w: chunks sum to %d bytes, the file is %d", name, id, ErrCorrupt, f.offsets[len(fe.Chunks)], fe.Size)
	}
	return f, nil
}

// Chunks is how many chunks the file has.
func (f *LazyFile) Chunks() int { return len(f.chunks) }

// Size is the file's size.
func (f *LazyFile) Size() int64 { return f.offsets[len(f.chunks)] }

// ReadAt reads len(p) bytes at off, fetching the chunks it spans (at once,
// in parallel). A chunk that fails its hash fails the read with
// ErrCorrupt: never wrong bytes.
func (f *LazyFile) ReadAt(p []byte, off int64) (int, error) {
	return f.ReadAtContext(context.Background(), p, off)
}

// ReadAtContext is ReadAt bounded by ctx.
func (f *LazyFile) ReadAtContext(ctx context.Context, p []byte, off int64) (int, error) {
	size := f.Size()
	if off >= size {
		return 0, io.EOF
	}
	end := min(off+int64(len(p)), size)
	first := sort.Search(len(f.chunks), func(i int) bool { return f.offsets[i+1] > off })
	last := sort.Search(len(f.chunks), func(i int) bool { return f.offsets[i+1] >= end })
	datas := make([][]byte, last-first+1)
	errs := make([]error, len(datas))
	var wg sync.WaitGroup
	for i := first; i <= last; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			datas[i-first], errs[i-first] = f.chunk(ctx, i)
		}()
	}
	wg.Wait()
	n := 0
	for i := first; i <= last; i++ {
		if err := errs[i-first]; err != nil {
			return n, fmt.Errorf("reading %s at %d: %w", f.id, off, err)
		}
		data := datas[i-first]
		from := max(off, f.offsets[i]) - f.offsets[i]
		to := min(end, f.offsets[i+1]) - f.offsets[i]
		n += copy(p[n:], data[from:to])
	}
	if end < off+int64(len(p)) {
		return n, io.EOF
	}
	return n, nil
}

// recentChunks is how many decoded chunks a LazyFile keeps in memory.
const recentChunks = 64

// chunk returns chunk i, one fetch at a time per chunk however many
// readers want it, and starts fetching the next one when reads go forward.
func (f *LazyFile) chunk(ctx context.Context, i int) ([]byte, error) {
	f.traceMu.Lock()
	if !f.traced[i] {
		f.traced[i] = true
		f.trace = append(f.trace, i)
	}
	// Only a read that follows the previous one reads ahead: a file
	// system's reads jump around, and fetching the next chunk after each
	// jump would double what a start fetches.
	sequential := i == f.prev+1
	if i != f.prev {
		f.prev = i
	}
	f.traceMu.Unlock()
	data, err := f.load(ctx, i)
	if err == nil && sequential && i+1 < len(f.chunks) {
		f.mu.Lock()
		_, have := f.recent[i+1]
		_, busy := f.inflight[i+1]
		f.mu.Unlock()
		if !have && !busy {
			f.aheadMu.Lock()
			f.aheadN++
			f.aheadMu.Unlock()
			go func() {
				defer func() {
					f.aheadMu.Lock()
					if f.aheadN--; f.aheadN == 0 {
						f.aheadIdle.Broadcast()
					}
					f.aheadMu.Unlock()
				}()
				f.load(context.WithoutCancel(ctx), i+1)
			}()
		}
	}
	return data, err
}

func (f *LazyFile) load(ctx context.Context, i int) ([]byte, error) {
	f.mu.Lock()
	if d, ok := f.recent[i]; ok {
		f.mu.Unlock()
		return d, nil
	}
	if c, ok := f.inflight[i]; ok {
		f.mu.Unlock()
		select {
		case <-c.done:
			return c.data, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c := &fetchCall{done: make(chan struct{})}
	f.inflight[i] = c
	f.mu.Unlock()
	var st restoreStats
	c.data, c.err = f.s.fetchChunk(ctx, f.chunks[i], &st)
	f.Fetched.Add(st.fromBackend.Load())
	f.FetchedBytes.Add(st.bytesFetched.Load())
	f.Hits.Add(st.fromCache.Load())
	close(c.done)
	f.mu.Lock()
	delete(f.inflight, i)
	if c.err == nil {
		f.recent[i] = c.data
		f.recentList = append(f.recentList, i)
		if len(f.recentList) > recentChunks {
			delete(f.recent, f.recentList[0])
			f.recentList = f.recentList[1:]
		}
	}
	f.mu.Unlock()
	return c.data, c.err
}

// Close waits for the reads ahead in flight (they fill the cache).
func (f *LazyFile) Close() error {
	f.aheadMu.Lock()
	for f.aheadN > 0 {
		f.aheadIdle.Wait()
	}
	f.aheadMu.Unlock()
	return nil
}

// Trace is the chunks reads asked for so far, by index, in the order they
// were first wanted (read-ahead not counted): what a start of the image
// reads, to store with it and Prefetch on the next cold start.
func (f *LazyFile) Trace() []int {
	f.traceMu.Lock()
	defer f.traceMu.Unlock()
	return append([]int(nil), f.trace...)
}

// Prefetch fetches the chunks of a Trace, in parallel (up to the store's
// concurrency), before anything reads them: one batch instead of a fetch
// per first read. A read that wants a chunk being prefetched waits for
// that fetch rather than starting its own. Indexes out of range are
// ignored (a trace of another version of the file).
func (f *LazyFile) Prefetch(ctx context.Context, trace []int) error {
	sem := make(chan struct{}, max(f.s.concurrency, 1))
	var wg sync.WaitGroup
	var first error
	var mu sync.Mutex
	for _, i := range trace {
		if i < 0 || i >= len(f.chunks) {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if _, err := f.load(ctx, i); err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return fmt.Errorf("prefetching %s: %w", f.id, first)
	}
	return nil
}
