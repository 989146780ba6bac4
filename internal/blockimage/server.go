package blockimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/store"
)

// The image server is the long-lived process of a node that serves its
// block images: it holds the FUSE mounts, the loop devices and the erofs
// mounts that sandboxes' root filesystems are, so that restarting `aenv
// server` or `aenv node` (an upgrade, a crash) never turns a running
// sandbox's root into I/O errors. The node starts it once and talks to it
// over a unix socket (client.go); it outlives the node and is taken over
// by the node's next process.
//
// Each image is mounted once per node, whatever number of sandboxes use
// it: they share its mount, its page cache and the chunk cache, each
// writing to its own layer on top (the runtime's overlay). A sandbox
// holds the image it runs from; an image no sandbox holds is released
// after a grace period.

// Defaults for ServerConfig fields left zero.
const (
	DefaultGrace       = 10 * time.Minute
	DefaultTraceWindow = 20 * time.Second
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Store is where images are fetched from: its chunk cache (bounded,
	// least recently used evicted) is the node's image cache. Without one
	// only local image files are served.
	Store *store.Repository
	// WorkDir holds one directory per mounted image.
	WorkDir string
	// Grace is how long an image no sandbox holds stays mounted
	// (default DefaultGrace): the next sandbox of its template finds it
	// there.
	Grace time.Duration
	// TraceWindow is how long after an image's first mount on the
	// cluster the chunks it read are recorded as its prefetch list
	// (default DefaultTraceWindow): a sandbox's boot and first commands.
	TraceWindow time.Duration
	Logger      *slog.Logger
}

// Source says where an image comes from.
type Source struct {
	// Image names the image: its manifest in the store, also the name
	// of its mount.
	Image string `json:"image"`
	// Template is the template the image is of (for logs and metrics).
	Template string `json:"template,omitempty"`
	// File, when set, is a local copy of the image to mount instead of
	// fetching it: the node that built the template has one.
	File string `json:"file,omitempty"`
	// Eager fetches the whole image to local disk before mounting it,
	// instead of on demand (for comparison, and for stores too slow to
	// read from on demand).
	Eager bool `json:"eager,omitempty"`
}

// validImage is what an image name may look like: it names a directory.
var validImage = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// Server serves a node's block images. It is safe for concurrent use.
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	mu      sync.Mutex
	images  map[string]*served
	holders map[string]string // holder → image
	closed  bool
	seq     int
	// released keeps, by template, the figures of images unmounted
	// since: counters must not go down.
	released map[string]imageCounters

	stop chan struct{}
	done chan struct{}
	// traces counts prefetch lists being recorded, which Close waits for.
	traces sync.WaitGroup
}

// served is one image mounted (or being mounted) on this node.
type served struct {
	src Source
	// dir holds its mounts: a directory of its own, so that a mount
	// being released never meets the next mount of the same image.
	dir string
	// ready is closed once the mount is done, err saying how it went.
	ready chan struct{}
	err   error

	lazy    *store.LazyFile // nil for local and eager images
	mounted *Mounted
	holders map[string]struct{}
	// idle is when the last holder let go (zero while held).
	idle time.Time
}

type imageCounters struct {
	fetchedBytes, hits, misses int64
}

// NewServer returns a Server; Run releases idle images in the background.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Grace == 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.TraceWindow == 0 {
		cfg.TraceWindow = DefaultTraceWindow
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.WorkDir, 0o755); err != nil {
		return nil, fmt.Errorf("starting the image server: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, images: map[string]*served{}, holders: map[string]string{},
		released: map[string]imageCounters{}, stop: make(chan struct{}), done: make(chan struct{})}
	Sweep(cfg.WorkDir, s.log)
	go s.releaseIdle()
	return s, nil
}

// Sweep unmounts what an image server that is gone left in workDir (it
// was killed): nothing can use those mounts any more, since a lazy
// image's files die with the FUSE server behind them.
func Sweep(workDir string, log *slog.Logger) {
	entries, _ := os.ReadDir(workDir)
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(workDir, e.Name())
		m := &Mounted{Dir: filepath.Join(dir, "root"), fuseDir: filepath.Join(dir, "fuse"), loop: loopOf(filepath.Join(dir, "root"))}
		if err := m.Close(); err != nil && log != nil {
			log.Warn("releasing an image a previous image server left", "dir", dir, "err", err)
		}
		os.RemoveAll(dir)
	}
}

// Acquire mounts src's image if this node has not yet, records holder (a
// sandbox) as using it, and returns the directory of its root filesystem
// (AcquireImage: and the image's file).
// Acquiring again for the same holder is a no-op; a holder holds one
// image at a time.
func (s *Server) Acquire(ctx context.Context, src Source, holder string) (string, error) {
	m, err := s.AcquireImage(ctx, src, holder)
	if err != nil {
		return "", err
	}
	return m.Dir, nil
}

// AcquireImage is Acquire returning the mount: its root filesystem's
// directory and the image's file.
func (s *Server) AcquireImage(ctx context.Context, src Source, holder string) (*Mounted, error) {
	if !validImage.MatchString(src.Image) {
		return nil, fmt.Errorf("acquiring image %q: invalid name", src.Image)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("acquiring an image: the image server is stopping")
	}
	img, ok := s.images[src.Image]
	if !ok {
		s.seq++
		img = &served{src: src, dir: filepath.Join(s.cfg.WorkDir, fmt.Sprintf("%s.%d", src.Image, s.seq)),
			ready: make(chan struct{}), holders: map[string]struct{}{}}
		s.images[src.Image] = img
		go s.mount(img)
	}
	if prev, ok := s.holders[holder]; ok && prev != src.Image {
		s.releaseLocked(holder)
	}
	s.holders[holder] = src.Image
	img.holders[holder] = struct{}{}
	img.idle = time.Time{}
	s.mu.Unlock()

	select {
	case <-img.ready:
	case <-ctx.Done():
		s.Release(holder)
		return nil, fmt.Errorf("acquiring image %s: %w", src.Image, ctx.Err())
	}
	if img.err != nil {
		s.Release(holder)
		return nil, img.err
	}
	return img.mounted, nil
}

// mountTimeout bounds mounting one image (an eager one is fetched whole
// first).
const mountTimeout = 30 * time.Minute

// mount serves img, closing img.ready. A failed mount is forgotten, so
// that the next Acquire tries again.
func (s *Server) mount(img *served) {
	defer close(img.ready)
	ctx, cancel := context.WithTimeout(context.Background(), mountTimeout)
	defer cancel()
	dir := img.dir
	log := s.log.With("image", img.src.Image, "template_id", img.src.Template)
	start := time.Now()
	var how string
	switch {
	case img.src.File == "" && s.cfg.Store == nil:
		img.err = errors.New("this node has no store to fetch it from (--store)")
	case img.src.File != "":
		how = "local file"
		img.mounted, img.err = MountFile(dir, img.src.File)
	case img.src.Eager:
		how = "fetched whole"
		img.err = s.cfg.Store.Restore(ctx, img.src.Image, filepath.Join(dir, "file"))
		if img.err == nil {
			img.mounted, img.err = MountFile(dir, filepath.Join(dir, "file", ImageName))
		}
	default:
		how = "on demand"
		img.lazy, img.err = s.cfg.Store.OpenLazy(ctx, img.src.Image, ImageName)
		if img.err == nil {
			prefetched := s.prefetch(ctx, img, log)
			img.mounted, img.err = Mount(dir, img.lazy, log)
			if img.err == nil && !prefetched {
				s.traces.Add(1)
				go s.recordTrace(img, log)
			}
		}
	}
	if img.err != nil {
		img.err = fmt.Errorf("mounting image %s of template %s: %w", img.src.Image, img.src.Template, img.err)
		log.Error("image not mounted", "err", img.err)
		s.mu.Lock()
		delete(s.images, img.src.Image)
		for h := range img.holders {
			delete(s.holders, h)
		}
		s.mu.Unlock()
		os.RemoveAll(dir)
		return
	}
	log.Info("image mounted", "how", how, "dir", img.mounted.Dir, "took_ms", time.Since(start).Milliseconds())
}

// TraceSuffix ends the id of an image's stored prefetch list (the
// image's id, then this): the store's garbage collector tells them apart.
const TraceSuffix = "-trace"

// traceID names the stored prefetch list of an image.
func traceID(image string) string { return image + TraceSuffix }

// traceRecord is a stored prefetch list: the image's chunks its first
// start read, in order.
type traceRecord struct {
	Chunks []int `json:"chunks"`
}

// prefetch starts fetching the chunks img's stored trace lists, in one
// batch, and reports whether there was one. The mount's own reads wait
// for those fetches instead of repeating them.
func (s *Server) prefetch(ctx context.Context, img *served, log *slog.Logger) bool {
	m, err := s.cfg.Store.Get(ctx, traceID(img.src.Image))
	if err != nil {
		return false
	}
	var tr traceRecord
	if err := json.Unmarshal(m.Meta, &tr); err != nil {
		log.Warn("ignoring an unreadable prefetch list", "err", err)
		return false
	}
	go func() {
		start := time.Now()
		if err := img.lazy.Prefetch(context.WithoutCancel(ctx), tr.Chunks); err != nil {
			log.Warn("prefetching an image", "err", err)
			return
		}
		log.Info("image prefetched", "chunks", len(tr.Chunks), "took_ms", time.Since(start).Milliseconds())
	}()
	return true
}

// recordTrace stores, once TraceWindow has passed, which chunks img's
// first start read: the next cold start on any node fetches them first.
func (s *Server) recordTrace(img *served, log *slog.Logger) {
	defer s.traces.Done()
	// A server stopping sooner records what was read so far.
	select {
	case <-time.After(s.cfg.TraceWindow):
	case <-s.stop:
	}
	chunks := img.lazy.Trace()
	meta, _ := json.Marshal(traceRecord{Chunks: chunks})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, _, err := s.cfg.Store.Save(ctx, traceID(img.src.Image), "", nil, meta); err != nil && !errors.Is(err, store.ErrExists) {
		log.Warn("storing an image's prefetch list", "err", err)
		return
	}
	log.Info("image prefetch list stored", "chunks", len(chunks), "of", img.lazy.Chunks())
}

// Release records that holder no longer uses its image. Releasing an
// unknown holder is a no-op.
func (s *Server) Release(holder string) {
	s.mu.Lock()
	s.releaseLocked(holder)
	s.mu.Unlock()
}

func (s *Server) releaseLocked(holder string) {
	name, ok := s.holders[holder]
	if !ok {
		return
	}
	delete(s.holders, holder)
	if img := s.images[name]; img != nil {
		delete(img.holders, holder)
		if len(img.holders) == 0 {
			img.idle = time.Now()
		}
	}
}

// Sync releases every holder not in live: a restarted node tells the image
// server which of its sandboxes survived.
func (s *Server) Sync(live []string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for h := range s.holders {
		if !slices.Contains(live, h) {
			s.releaseLocked(h)
			n++
		}
	}
	return n
}

// releaseIdle unmounts images held by no one for longer than Grace.
func (s *Server) releaseIdle() {
	defer close(s.done)
	t := time.NewTicker(min(s.cfg.Grace/4+time.Millisecond, 30*time.Second))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		for _, img := range s.idleImages(time.Now().Add(-s.cfg.Grace)) {
			s.unmount(img, "unused for "+s.cfg.Grace.String())
		}
	}
}

// idleImages takes out of the table the mounted images idle since before
// cutoff.
func (s *Server) idleImages(cutoff time.Time) []*served {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*served
	for name, img := range s.images {
		select {
		case <-img.ready:
		default:
			continue
		}
		if len(img.holders) == 0 && !img.idle.IsZero() && img.idle.Before(cutoff) {
			delete(s.images, name)
			out = append(out, img)
		}
	}
	return out
}

func (s *Server) unmount(img *served, why string) {
	s.mu.Lock()
	s.released[img.src.Template] = s.released[img.src.Template].add(counters(img))
	s.mu.Unlock()
	err := img.mounted.Close()
	if img.lazy != nil {
		img.lazy.Close()
	}
	os.RemoveAll(img.dir)
	if err != nil {
		s.log.Error("releasing image", "image", img.src.Image, "template_id", img.src.Template, "err", err)
		return
	}
	s.log.Info("image released", "image", img.src.Image, "template_id", img.src.Template, "why", why)
}

func (c imageCounters) add(d imageCounters) imageCounters {
	return imageCounters{fetchedBytes: c.fetchedBytes + d.fetchedBytes, hits: c.hits + d.hits, misses: c.misses + d.misses}
}

func counters(img *served) imageCounters {
	if img.lazy == nil {
		return imageCounters{}
	}
	return imageCounters{fetchedBytes: img.lazy.FetchedBytes.Load(), hits: img.lazy.Hits.Load(), misses: img.lazy.Fetched.Load()}
}

// ImageStatus describes one image the server has mounted.
type ImageStatus struct {
	Source
	Dir     string   `json:"dir"`
	Holders []string `json:"holders"`
	// FetchedBytes, Hits and Misses are its chunk reads from the store
	// (as stored), from the cache, and not from the cache.
	FetchedBytes int64 `json:"fetchedBytes"`
	Hits         int64 `json:"cacheHits"`
	Misses       int64 `json:"cacheMisses"`
	Size         int64 `json:"size"`
}

// Images lists the images mounted (those being mounted left out).
func (s *Server) Images() []ImageStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []ImageStatus
	for _, name := range slices.Sorted(maps.Keys(s.images)) {
		img := s.images[name]
		select {
		case <-img.ready:
		default:
			continue
		}
		if img.err != nil {
			continue
		}
		c := counters(img)
		st := ImageStatus{Source: img.src, Dir: img.mounted.Dir, Holders: slices.Sorted(maps.Keys(img.holders)),
			FetchedBytes: c.fetchedBytes, Hits: c.hits, Misses: c.misses}
		if img.lazy != nil {
			st.Size = img.lazy.Size()
		}
		out = append(out, st)
	}
	return out
}

// Close unmounts every image: the sandboxes using them must be gone.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	imgs := slices.Collect(maps.Values(s.images))
	s.images = map[string]*served{}
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	for _, img := range imgs {
		<-img.ready
		if img.err == nil {
			s.unmount(img, "image server stopping")
		}
	}
	// Every mount is done, so every recording has begun.
	s.traces.Wait()
	return nil
}
