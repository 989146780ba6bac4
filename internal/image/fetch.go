package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
)

// unpackAll applies src's layers in order to the stage's root filesystem,
// then makes the tree usable by aenv. Remote layers are downloaded
// opts.Jobs at a time, ahead of the unpacking, into spools (memory, then
// the stage's scratch directory); a layer is unpacked as it arrives, not
// once it is complete.
//
// cancel must end ctx, which the source's requests were made with: on
// failure it stops the downloads still running, so that none outlives the
// stage.
func unpackAll(ctx context.Context, cancel context.CancelFunc, src *imageSource, rootDir, scratch string, rep *reporter, opts PullOptions, log *slog.Logger) (err error) {
	root, err := openRoot(rootDir)
	if err != nil {
		return err
	}
	defer root.close()
	u := newUnpacker(root, log)
	stored := &budget{max: opts.MaxBytes, what: "as stored"}
	unpacked := &budget{max: opts.MaxBytes, what: "unpacked"}

	var pf *prefetcher
	if src.prefetch {
		pf = startPrefetch(ctx, src.layers, scratch, opts.Jobs, rep, stored)
		defer func() {
			if err != nil {
				cancel()
			}
			pf.wait()
		}()
	}
	for i, l := range src.layers {
		var rc io.ReadCloser
		if pf != nil {
			rc = &countingReader{ctx: ctx, rc: pf.reader(i), add: func(n int64) { rep.applied(i, n) }}
		} else {
			raw, err := l.open(ctx)
			if err != nil {
				return fmt.Errorf("reading layer %d (%s): %w", i+1, l.digest, err)
			}
			rc = &countingReader{ctx: ctx, rc: raw, limit: stored, add: func(n int64) {
				rep.fetched(i, n)
				rep.applied(i, n)
			}}
		}
		err := unpackLayer(ctx, u, rc, unpacked)
		rc.Close()
		if err != nil {
			return fmt.Errorf("unpacking layer %d (%s): %w", i+1, l.digest, err)
		}
		if pf != nil {
			pf.release(i)
		}
		rep.unpacked(i)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return makeUsable(root)
}

// countingReader reports bytes read and stops at cancellation, or past
// its limit (nil: none).
type countingReader struct {
	ctx   context.Context
	rc    io.ReadCloser
	add   func(int64)
	limit *budget
}

func (c *countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.rc.Read(p)
	if n > 0 {
		c.add(int64(n))
		if lerr := c.limit.take(int64(n)); lerr != nil {
			return n, lerr
		}
	}
	return n, err
}

func (c *countingReader) Close() error { return c.rc.Close() }

// prefetcher downloads layers into spool files ahead of the unpacker.
type prefetcher struct {
	spools []*spool
	wg     sync.WaitGroup
}

func startPrefetch(ctx context.Context, layers []*layerSource, dir string, jobs int, rep *reporter, limit *budget) *prefetcher {
	p := &prefetcher{spools: make([]*spool, len(layers))}
	for i := range layers {
		p.spools[i] = newSpool(filepath.Join(dir, fmt.Sprintf("layer-%d", i)))
	}
	sem := make(chan struct{}, jobs)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		// Layers start in order, so that the one being unpacked is never
		// starved by later ones.
		for i, l := range layers {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				for _, s := range p.spools[i:] {
					s.finish(ctx.Err())
				}
				return
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				defer func() { <-sem }()
				p.spools[i].fill(ctx, l, func(n int64) error {
					rep.fetched(i, n)
					return limit.take(n)
				})
			}()
		}
	}()
	return p
}

// reader reads layer i as it downloads.
func (p *prefetcher) reader(i int) io.ReadCloser { return &spoolReader{s: p.spools[i]} }

// release deletes layer i's download once it is unpacked.
func (p *prefetcher) release(i int) { p.spools[i].remove() }

// wait returns once every download has stopped, and deletes what they
// left.
func (p *prefetcher) wait() {
	p.wg.Wait()
	for _, s := range p.spools {
		s.remove()
	}
}

// spoolMemory is how much of a layer a spool keeps in memory before it
// spills the rest to a file: small layers, and the layer being unpacked
// while it downloads, never touch the disk twice.
const spoolMemory = 16 << 20

// spoolChunk is the size of one read from the source.
const spoolChunk = 256 << 10

// spool is a layer being downloaded and read back while it grows: its
// first bytes queue in memory, the rest (once spoolMemory is queued and
// not yet read) goes to a file.
type spool struct {
	path  string
	limit int64 // spoolMemory, but for tests
	mu    sync.Mutex
	cond  *sync.Cond
	mem   [][]byte // queued chunks, oldest first; they precede the file
	held  int64    // bytes in mem
	f     *os.File // the spill file, once there is one
	n     int64    // bytes written to the file
	done  bool     // all bytes written, or failed
	err   error
}

func newSpool(path string) *spool {
	s := &spool{path: path, limit: spoolMemory}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// fill downloads l into the spool; add counts what arrives, and ends the
// download when it fails.
func (s *spool) fill(ctx context.Context, l *layerSource, add func(int64) error) {
	rc, err := l.open(ctx)
	if err != nil {
		s.finish(err)
		return
	}
	defer rc.Close()
	var spill []byte // reused once writing to the file
	for {
		buf := spill
		if buf == nil {
			buf = make([]byte, spoolChunk)
		}
		// Fill whole chunks, but tell a clean end (io.EOF) from a
		// truncated body (io.ErrUnexpectedEOF), which must fail.
		n, rerr := 0, error(nil)
		for n < len(buf) && rerr == nil {
			var k int
			k, rerr = rc.Read(buf[n:])
			n += k
		}
		if n > 0 {
			if err := add(int64(n)); err != nil {
				s.finish(err)
				return
			}
			if err := s.put(buf[:n]); err != nil {
				s.finish(err)
				return
			}
			if spill == nil && s.spilled() {
				spill = make([]byte, spoolChunk)
			}
		}
		if errors.Is(rerr, io.EOF) {
			s.finish(nil)
			return
		}
		if rerr != nil {
			s.finish(rerr)
			return
		}
		if err := ctx.Err(); err != nil {
			s.finish(err)
			return
		}
	}
}

// put queues b in memory, or appends it to the spill file.
func (s *spool) put(b []byte) error {
	s.mu.Lock()
	if s.f == nil && s.held+int64(len(b)) <= s.limit {
		s.mem = append(s.mem, b)
		s.held += int64(len(b))
		s.cond.Broadcast()
		s.mu.Unlock()
		return nil
	}
	if s.f == nil {
		f, err := os.OpenFile(s.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			s.mu.Unlock()
			return err
		}
		s.f = f
	}
	f := s.f
	s.mu.Unlock()
	// Only this goroutine writes; readers only read below s.n.
	if _, err := f.Write(b); err != nil {
		return err
	}
	s.mu.Lock()
	s.n += int64(len(b))
	s.cond.Broadcast()
	s.mu.Unlock()
	return nil
}

func (s *spool) spilled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.f != nil
}

// finish marks the download over, failed if err is set.
func (s *spool) finish(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	s.done, s.err = true, err
	s.cond.Broadcast()
}

// remove drops what the spool holds. The download must be over.
func (s *spool) remove() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mem, s.held = nil, 0
	if s.f != nil {
		s.f.Close()
		os.Remove(s.path)
		s.f = nil
	}
}

// spoolReader reads a spool from the start, waiting for bytes not yet
// downloaded.
type spoolReader struct {
	s   *spool
	off int64 // read offset in the spill file
}

func (r *spoolReader) Read(p []byte) (int, error) {
	s := r.s
	s.mu.Lock()
	for len(s.mem) == 0 && (s.f == nil || r.off >= s.n) && !s.done {
		s.cond.Wait()
	}
	if len(s.mem) > 0 {
		n := copy(p, s.mem[0])
		if n == len(s.mem[0]) {
			s.mem[0] = nil
			s.mem = s.mem[1:]
		} else {
			s.mem[0] = s.mem[0][n:]
		}
		s.held -= int64(n)
		s.mu.Unlock()
		return n, nil
	}
	f, n, err := s.f, s.n, s.err
	s.mu.Unlock()
	if f != nil && r.off < n {
		if avail := n - r.off; int64(len(p)) > avail {
			p = p[:avail]
		}
		k, rerr := f.ReadAt(p, r.off)
		r.off += int64(k)
		if errors.Is(rerr, io.EOF) && k > 0 {
			rerr = nil
		}
		return k, rerr
	}
	if err != nil {
		return 0, err
	}
	return 0, io.EOF
}

func (r *spoolReader) Close() error { return nil }
