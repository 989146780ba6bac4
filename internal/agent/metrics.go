package agent

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenvhq/aenv/internal/node"
)

// Metrics are the node's own figures for /metrics: its warm pool, and
// its block images (the image server's) when it serves any, read at each
// gather.
func (h *Host) Metrics() prometheus.Gatherer {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newPoolCollector(h.node))
	if h.imageServer == nil {
		return reg
	}
	return prometheus.Gatherers{reg, h.imageServer}
}

// poolCollector reports a node's warm pool, one series per template (or
// snapshot) it holds, sizes or served.
type poolCollector struct {
	n                              *node.Node
	ready, target, memory, creates *prometheus.Desc
	budget                         *prometheus.Desc
	// prepared and restores are the pool's prepared sandboxes, by
	// template, and the restores they could serve.
	prepared, restores *prometheus.Desc
}

func newPoolCollector(n *node.Node) *poolCollector {
	labels := []string{"template", "snapshot"}
	return &poolCollector{n: n,
		ready: prometheus.NewDesc("aenv_warm_pool_sandboxes",
			"Sandboxes the node's warm pool holds prestarted, by template (or snapshot used as one).", labels, nil),
		target: prometheus.NewDesc("aenv_warm_pool_target",
			"Sandboxes the warm pool is sized to hold: the recent peak burst of creates within the memory budget, or the floor.", labels, nil),
		memory: prometheus.NewDesc("aenv_warm_pool_memory_bytes",
			"Host memory the warm pool's prestarted sandboxes take, as last measured.", labels, nil),
		creates: prometheus.NewDesc("aenv_warm_pool_creates_total",
			"Creates the warm pool could serve, by whether a prestarted sandbox served them (warm) or one was booted.",
			append(labels, "warm"), nil),
		budget: prometheus.NewDesc("aenv_warm_pool_budget_bytes",
			"Host memory the warm pool may take (--warm-pool-memory).", nil, nil),
		prepared: prometheus.NewDesc("aenv_warm_pool_prepared",
			"Prepared sandboxes the warm pool holds, which restores of the template's sandboxes load their state into.",
			[]string{"template"}, nil),
		restores: prometheus.NewDesc("aenv_warm_pool_restores_total",
			"Restores of the template's sandboxes a prepared sandbox could serve, by whether one did (warm).",
			[]string{"template", "warm"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.ready, c.target, c.memory, c.creates, c.budget, c.prepared, c.restores} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	wp := c.n.WarmPool()
	ch <- prometheus.MustNewConstMetric(c.budget, prometheus.GaugeValue, float64(wp.BudgetBytes))
	for _, k := range wp.PerTemplate() {
		if k.Key.Restores {
			ch <- prometheus.MustNewConstMetric(c.prepared, prometheus.GaugeValue, float64(k.Ready), k.Key.TemplateID)
			for warm, count := range map[bool]uint64{true: k.Served.Warm, false: k.Served.Cold} {
				ch <- prometheus.MustNewConstMetric(c.restores, prometheus.CounterValue, float64(count), k.Key.TemplateID, strconv.FormatBool(warm))
			}
			continue
		}
		l := []string{k.Key.TemplateID, k.Key.SnapshotID}
		ch <- prometheus.MustNewConstMetric(c.ready, prometheus.GaugeValue, float64(k.Ready), l...)
		ch <- prometheus.MustNewConstMetric(c.target, prometheus.GaugeValue, float64(k.Target), l...)
		ch <- prometheus.MustNewConstMetric(c.memory, prometheus.GaugeValue, float64(k.MemoryBytes), l...)
		for warm, count := range map[bool]uint64{true: k.Served.Warm, false: k.Served.Cold} {
			ch <- prometheus.MustNewConstMetric(c.creates, prometheus.CounterValue, float64(count), append(l, strconv.FormatBool(warm))...)
		}
	}
}
