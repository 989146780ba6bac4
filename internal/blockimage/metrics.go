package blockimage

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenvhq/aenv/internal/store"
)

// The image server's figures, in Prometheus' format: by template what
// its images fetched from the store and how the cache served them, and
// for the node's cache as a whole its size and evictions (chunks are
// shared between templates, so those have no template). A total over
// templates is their sum.
var (
	fetchedDesc = prometheus.NewDesc("aenv_image_fetched_bytes_total",
		"Bytes of image chunks fetched from the store (as stored, compressed), by template.", []string{"template"}, nil)
	hitsDesc = prometheus.NewDesc("aenv_image_cache_hits_total",
		"Image chunk reads the node's cache served, by template.", []string{"template"}, nil)
	missesDesc = prometheus.NewDesc("aenv_image_cache_misses_total",
		"Image chunk reads the node's cache could not serve (fetched from the store), by template.", []string{"template"}, nil)
	evictionsDesc = prometheus.NewDesc("aenv_image_cache_evictions_total",
		"Chunks the node's image cache dropped to stay within its bound.", nil, nil)
	cacheBytesDesc = prometheus.NewDesc("aenv_image_cache_bytes",
		"Bytes the node's image cache holds.", nil, nil)
	cacheMaxDesc = prometheus.NewDesc("aenv_image_cache_max_bytes",
		"The node's image cache bound (--image-cache-size).", nil, nil)
	mountedDesc = prometheus.NewDesc("aenv_images_mounted",
		"Images mounted on the node.", nil, nil)
)

// Describe implements prometheus.Collector.
func (s *Server) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{fetchedDesc, hitsDesc, missesDesc, evictionsDesc, cacheBytesDesc, cacheMaxDesc, mountedDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	by, mounted, cs := s.figures()
	for t, c := range by {
		ch <- prometheus.MustNewConstMetric(fetchedDesc, prometheus.CounterValue, float64(c.fetchedBytes), t)
		ch <- prometheus.MustNewConstMetric(hitsDesc, prometheus.CounterValue, float64(c.hits), t)
		ch <- prometheus.MustNewConstMetric(missesDesc, prometheus.CounterValue, float64(c.misses), t)
	}
	ch <- prometheus.MustNewConstMetric(evictionsDesc, prometheus.CounterValue, float64(cs.Evictions))
	ch <- prometheus.MustNewConstMetric(cacheBytesDesc, prometheus.GaugeValue, float64(cs.Bytes))
	ch <- prometheus.MustNewConstMetric(cacheMaxDesc, prometheus.GaugeValue, float64(cs.MaxBytes))
	ch <- prometheus.MustNewConstMetric(mountedDesc, prometheus.GaugeValue, float64(mounted))
}

// CacheStats is the node's image cache as a whole, as GET /v1/info
// reports it for the node's record: the figures of /metrics, summed over
// templates.
type CacheStats struct {
	// Bytes is what the cache holds, within MaxBytes (--image-cache-size).
	Bytes    int64 `json:"bytes"`
	MaxBytes int64 `json:"maxBytes"`
	// Hits and Misses count the images' chunk reads the cache served or
	// not (then fetched from the store) since the server started, those
	// of images since released included; Evictions the chunks dropped to
	// stay within MaxBytes.
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Evictions int64 `json:"evictions"`
	// Mounted counts the images mounted now.
	Mounted int `json:"mounted"`
}

// CacheStats sums the server's figures for the node's report.
func (s *Server) CacheStats() CacheStats {
	by, mounted, cs := s.figures()
	out := CacheStats{Bytes: cs.Bytes, MaxBytes: cs.MaxBytes, Evictions: cs.Evictions, Mounted: mounted}
	for _, c := range by {
		out.Hits += c.hits
		out.Misses += c.misses
	}
	return out
}

// figures are the server's counters by template (mounted images' and
// released ones'), how many images are mounted, and its chunk cache's
// figures.
func (s *Server) figures() (map[string]imageCounters, int, store.CacheStats) {
	s.mu.Lock()
	by := map[string]imageCounters{}
	for t, c := range s.released {
		by[t] = c
	}
	mounted := 0
	for _, img := range s.images {
		select {
		case <-img.ready:
		default:
			continue
		}
		if img.err == nil {
			mounted++
			by[img.src.Template] = by[img.src.Template].add(counters(img))
		}
	}
	s.mu.Unlock()
	var cs store.CacheStats
	if s.cfg.Store != nil {
		cs = s.cfg.Store.CacheStats()
	}
	return by, mounted, cs
}
