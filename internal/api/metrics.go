package api

import (
	"context"
	"net/http"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/template"
)

// metricsHandler serves GET /metrics (behind the API key) in Prometheus'
// text format: the server process's own figures (goroutines, memory, open
// files: what a soak test watches for leaks), the sandboxes by state, and
// Config.Metrics (the local node's warm pool and block images).
// The registry is this server's, not the library's global one.
func (s *Handler) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		// The live heap at the last GC beside MemStats' figures: heap in
		// use counts garbage not yet swept, so only the live heap shows a
		// leak between two readings taken at any moment.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	for _, st := range []cluster.State{cluster.StateRunning, cluster.StatePaused} {
		if s.cfg.Cluster == nil {
			break
		}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "aenv_sandboxes",
			Help:        "Sandboxes the cluster has, by state.",
			ConstLabels: prometheus.Labels{"state": string(st)},
		}, func() float64 {
			return float64(s.cfg.Cluster.Count(cluster.ListFilter{States: []cluster.State{st}}))
		}))
	}
	if s.cfg.Templates != nil {
		usage := func(f func(template.Usage) int64) func() float64 {
			return func() float64 {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				u, _ := s.cfg.Templates.Usage(ctx)
				return float64(f(u))
			}
		}
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aenv_template_image_bytes",
				Help: "Sum of the templates' block image sizes."}, usage(func(u template.Usage) int64 { return u.ImageBytes })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aenv_template_stored_bytes",
				Help: "What the store keeps of the templates' block images, each shared chunk once (deduplicated, uncompressed)."},
				usage(func(u template.Usage) int64 { return u.StoredBytes })),
		)
	}
	var g prometheus.Gatherer = reg
	if s.cfg.Metrics != nil {
		g = prometheus.Gatherers{reg, s.cfg.Metrics}
	}
	// A part that cannot be read (the image server restarting) leaves the
	// rest served.
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
