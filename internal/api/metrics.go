package api

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/template"
)

// metricsHandler serves GET /metrics (behind the API key) in Prometheus'
// text format: the server process's own figures (goroutines, memory, open
// files: what a soak test watches for leaks), the API's requests and
// creates, the cluster as this server sees it (sandboxes by state, the
// nodes' reports, each running sandbox's use, placement refusals: see
// ClusterCollector), and Config.Metrics (the local node's warm pool and
// block images). The registry is this server's, not the library's global
// one.
func (s *Handler) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		// The live heap at the last GC beside MemStats' figures: heap in
		// use counts garbage not yet swept, so only the live heap shows a
		// leak between two readings taken at any moment.
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		s.counts.requests, s.counts.creates,
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
	if s.cfg.Cluster != nil {
		reg.MustRegister(NewClusterCollector(s.cfg.Cluster))
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

// apiMetrics are what the handler counts of its own work.
type apiMetrics struct {
	// requests counts the control plane's answers by route pattern (the
	// mux's, so bounded by the routes) and status code.
	requests *prometheus.CounterVec
	// creates times sandbox creates (single and batched) by outcome.
	creates *prometheus.HistogramVec
}

// createOutcomes are the creates' outcomes, each a class of the
// cluster's errors (createOutcome).
var createOutcomes = []string{"ok", "invalid", "not_found", "conflict", "quota", "no_capacity", "unavailable", "canceled", "error"}

func newAPIMetrics() *apiMetrics {
	m := &apiMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aenv_api_requests_total",
			Help: "Control-plane requests answered, by route and status code (sandbox traffic through the proxy excluded; route \"\" is a request refused before routing, by the rate limit)."},
			[]string{"route", "code"}),
		creates: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "aenv_sandbox_create_duration_seconds",
			Help: "How long sandbox creates (POST /sandboxes, each of a batch) took, by outcome: ok, or the class of their error.",
			// From a warm pool's tens of milliseconds to a cold pull.
			Buckets: []float64{0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}},
			[]string{"outcome"}),
	}
	// Every outcome from the start, so that a rate over one that has not
	// happened yet is 0, not absent.
	for _, o := range createOutcomes {
		m.creates.WithLabelValues(o)
	}
	return m
}

// createOutcome is the class of a create's error, for its count.
func createOutcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, cluster.ErrInvalid):
		return "invalid"
	case errors.Is(err, cluster.ErrNotFound), errors.Is(err, cluster.ErrTemplateNotFound), errors.Is(err, cluster.ErrVolumeNotFound):
		return "not_found"
	case errors.Is(err, cluster.ErrConflict), errors.Is(err, cluster.ErrIdempotencyConflict):
		return "conflict"
	case errors.Is(err, cluster.ErrQuota):
		return "quota"
	case errors.Is(err, cluster.ErrNoCapacity):
		return "no_capacity"
	case errors.Is(err, cluster.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "error"
}

// create is Cluster.Create, timed.
func (s *Handler) create(ctx context.Context, req cluster.CreateRequest) (*cluster.Sandbox, error) {
	start := time.Now()
	sb, err := s.cfg.Cluster.Create(ctx, req)
	s.counts.creates.WithLabelValues(createOutcome(err)).Observe(time.Since(start).Seconds())
	return sb, err
}

// countRequests counts next's answers by the route the mux matched (it
// sets the request's Pattern) and their status.
func (s *Handler) countRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		s.counts.requests.WithLabelValues(r.Pattern, strconv.Itoa(sw.status)).Inc()
	})
}

// statusWriter notes the status a handler answers with. Unwrap lets
// http.ResponseController reach the connection beneath (flushes, read
// deadlines, full duplex).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
