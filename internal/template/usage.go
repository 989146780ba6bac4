package template

import (
	"context"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/store"
)

// Usage is what the templates' block images take: as images, and in the
// store, where a chunk that several images share (a common base, a
// package two templates install) is kept once.
type Usage struct {
	// ImageBytes is the sum of the images' sizes: what whole copies of
	// them would take.
	ImageBytes int64 `json:"imageBytes"`
	// StoredBytes is what the store keeps of them: each distinct chunk
	// once (uncompressed; zstd takes less).
	StoredBytes int64 `json:"storedBytes"`
	// Templates has, per template with an image, the bytes of its chunks
	// no other template's image shares: what deleting it would free.
	Templates map[string]int64 `json:"templates"`
}

// usageTTL is how long a computed Usage is served again.
const usageTTL = 30 * time.Second

// usageCache keeps the last Usage and the image manifests read (an image
// never changes: it is named by its content).
type usageCache struct {
	mu     sync.Mutex
	at     time.Time
	last   Usage
	images map[string][]store.ChunkRef
}

// Usage reports what the templates' block images take (cached for
// usageTTL: metrics ask often). Without a store each image is kept whole
// on its host.
func (s *Catalog) Usage(ctx context.Context) (Usage, error) {
	s.usage.mu.Lock()
	fresh, last := time.Since(s.usage.at) < usageTTL, s.usage.last
	s.usage.mu.Unlock()
	if fresh {
		return last, nil
	}
	ts, err := s.List()
	if err != nil {
		return Usage{}, err
	}
	u := s.UsageOf(ctx, ts)
	s.usage.mu.Lock()
	s.usage.at, s.usage.last = time.Now(), u
	s.usage.mu.Unlock()
	return u, nil
}

// UsageOf is Usage over templates ts, as List returned them (a caller
// that has listed them already).
func (s *Catalog) UsageOf(ctx context.Context, ts []*Template) Usage {
	s.usage.mu.Lock()
	defer s.usage.mu.Unlock()
	// Only the images still listed stay cached.
	cached := s.usage.images
	s.usage.images = map[string][]store.ChunkRef{}
	u := Usage{Templates: map[string]int64{}}
	owners := map[string]map[string]bool{} // chunk → templates
	sizes := map[string]int64{}
	for _, t := range ts {
		if t.BlockImage == "" {
			continue
		}
		u.ImageBytes += t.ImageBytes
		u.Templates[t.ID] = 0
		if s.images == nil {
			u.StoredBytes += t.ImageBytes
			u.Templates[t.ID] = t.ImageBytes
			continue
		}
		chunks, ok := cached[t.BlockImage]
		if !ok {
			m, err := s.images.Get(ctx, t.BlockImage)
			if err != nil {
				continue // published meanwhile or being deleted: counted next time
			}
			for _, f := range m.Files {
				chunks = append(chunks, f.Chunks...)
			}
		}
		s.usage.images[t.BlockImage] = chunks
		for _, c := range chunks {
			if owners[c.Hash] == nil {
				owners[c.Hash] = map[string]bool{}
			}
			owners[c.Hash][t.ID] = true
			sizes[c.Hash] = c.Size
		}
	}
	for h, own := range owners {
		u.StoredBytes += sizes[h]
		if len(own) == 1 {
			for id := range own {
				u.Templates[id] += sizes[h]
			}
		}
	}
	return u
}
