package api

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenvhq/aenv/internal/cluster"
)

// ClusterCollector exports the cluster as this API server sees it, so
// that scraping API servers alone covers the cluster (node agents serve
// their /metrics to servers only): each node's last report from the
// registry, the last resource sample of each running sandbox, and the
// placements refused.
//
// Cardinality: the node series are one per node the registry knows (a
// lost node keeps its state and report time until it is removed), the
// sandbox series one per sandbox running now. Those are made afresh at
// each scrape from what runs (const metrics, not a vector that would
// have to forget them), so a sandbox that ends, or pauses, is gone from
// the next scrape: their count is bounded by the running sandboxes, not
// by all there ever were.
type ClusterCollector struct {
	c *cluster.Cluster
}

// NewClusterCollector exports c's figures. A nil c describes the metrics
// and collects none (what a check of their names needs).
func NewClusterCollector(c *cluster.Cluster) *ClusterCollector { return &ClusterCollector{c: c} }

// collectTimeout bounds what a scrape reads of the store and the nodes.
const collectTimeout = 5 * time.Second

func nodeDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, append([]string{"node"}, labels...), nil)
}

func sandboxDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help+" (the node's last sample, every 5 s; running sandboxes only).",
		[]string{"sandbox_id", "node", "template"}, nil)
}

var (
	nodeInfoDesc = nodeDesc("aenv_node_info",
		"1 for each node the registry knows, labelled with its state (ready, draining, lost), runtime and version.",
		"state", "runtime", "runtime_version", "version")
	nodeReportDesc = nodeDesc("aenv_node_last_report_timestamp_seconds",
		"When the node last reported (a lost node's stays where it stopped).")
	nodeCPUsDesc          = nodeDesc("aenv_node_cpus", "vCPUs the node offers sandboxes (its capacity).")
	nodeCPUsCommittedDesc = nodeDesc("aenv_node_cpus_committed",
		"vCPUs the node's sandboxes are configured with, its warm pool's included.")
	nodeMemoryDesc          = nodeDesc("aenv_node_memory_bytes", "Memory the node offers sandboxes (its capacity, before overcommit).")
	nodeMemoryCommittedDesc = nodeDesc("aenv_node_memory_committed_bytes",
		"Memory the node's sandboxes are configured with, its warm pool's included (what admission counts).")
	nodeMemoryUsedDesc = nodeDesc("aenv_node_memory_used_bytes", "The node host's memory in use.")
	nodeHostMemoryDesc = nodeDesc("aenv_node_host_memory_bytes", "The node host's physical memory.")
	nodeDiskDesc       = nodeDesc("aenv_node_disk_bytes", "Size of the disk the node's sandboxes' files go to.")
	nodeDiskUsedDesc   = nodeDesc("aenv_node_disk_used_bytes", "Bytes used of the disk the node's sandboxes' files go to.")
	nodeSandboxesDesc  = nodeDesc("aenv_node_sandboxes", "Running sandboxes the cluster's records place on the node.")
	nodePoolDesc       = nodeDesc("aenv_node_pool_sandboxes",
		"Sandboxes the node's warm pool holds prestarted, by template (or snapshot).", "template", "snapshot")
	nodePoolTargetDesc = nodeDesc("aenv_node_pool_target",
		"Sandboxes the node's warm pool is sized to hold, by template (or snapshot).", "template", "snapshot")
	nodePoolPreparedDesc = nodeDesc("aenv_node_pool_prepared",
		"Prepared sandboxes the node's warm pool holds, which restores of the template's sandboxes load their state into.", "template")
	nodeCacheBytesDesc = nodeDesc("aenv_node_image_cache_bytes", "Bytes the node's block image cache holds.")
	nodeCacheMaxDesc   = nodeDesc("aenv_node_image_cache_max_bytes", "The node's block image cache bound.")
	nodeCacheHitsDesc  = nodeDesc("aenv_node_image_cache_hits_total",
		"Image chunk reads the node's cache served, since its image server started.")
	nodeCacheMissesDesc = nodeDesc("aenv_node_image_cache_misses_total",
		"Image chunk reads the node's cache could not serve (fetched from the store), since its image server started.")
	nodeCacheEvictionsDesc = nodeDesc("aenv_node_image_cache_evictions_total",
		"Chunks the node's image cache dropped to stay within its bound, since its image server started.")
	nodeImagesMountedDesc = nodeDesc("aenv_node_images_mounted", "Block images mounted on the node.")

	sandboxCPUsDesc     = sandboxDesc("aenv_sandbox_cpus", "vCPUs the sandbox is configured with")
	sandboxCPUDesc      = sandboxDesc("aenv_sandbox_cpu_usage_ratio", "How busy the sandbox's vCPUs were, 0 to 1")
	sandboxMemDesc      = sandboxDesc("aenv_sandbox_memory_used_bytes", "Memory the sandbox uses")
	sandboxMemLimitDesc = sandboxDesc("aenv_sandbox_memory_limit_bytes", "Memory the sandbox is configured with")
	sandboxDiskDesc     = sandboxDesc("aenv_sandbox_disk_used_bytes", "Bytes the sandbox's writable disk holds")
	sandboxDiskMaxDesc  = sandboxDesc("aenv_sandbox_disk_limit_bytes", "Size of the sandbox's writable disk (0: unbounded)")

	refusalsDesc = prometheus.NewDesc("aenv_placement_refusals_total",
		"Placements this server refused since it started, by cause: no node could take the sandbox (draining, runtime, no_node, too_large, no_room), a node refused what placement chose for it (node_refused, the create moving on), or the nodes chosen left (node_left).",
		[]string{"cause"}, nil)
)

var clusterDescs = []*prometheus.Desc{
	nodeInfoDesc, nodeReportDesc, nodeCPUsDesc, nodeCPUsCommittedDesc, nodeMemoryDesc, nodeMemoryCommittedDesc,
	nodeMemoryUsedDesc, nodeHostMemoryDesc, nodeDiskDesc, nodeDiskUsedDesc, nodeSandboxesDesc, nodePoolDesc,
	nodePoolTargetDesc, nodePoolPreparedDesc, nodeCacheBytesDesc, nodeCacheMaxDesc, nodeCacheHitsDesc, nodeCacheMissesDesc,
	nodeCacheEvictionsDesc, nodeImagesMountedDesc,
	sandboxCPUsDesc, sandboxCPUDesc, sandboxMemDesc, sandboxMemLimitDesc, sandboxDiskDesc, sandboxDiskMaxDesc,
	refusalsDesc,
}

// Describe implements prometheus.Collector.
func (cc *ClusterCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range clusterDescs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (cc *ClusterCollector) Collect(ch chan<- prometheus.Metric) {
	if cc.c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	for cause, n := range cc.c.PlacementRefusals() {
		ch <- prometheus.MustNewConstMetric(refusalsDesc, prometheus.CounterValue, float64(n), cause)
	}
	// A store that does not answer leaves the nodes out of this scrape;
	// what the nodes answer still goes.
	if nodes, err := cc.c.Nodes(ctx); err == nil {
		for _, n := range nodes {
			collectNode(ch, n)
		}
	}
	for _, u := range cc.c.SandboxUsage(ctx) {
		l := []string{u.ID, u.NodeID, u.TemplateID}
		// No timestamp of the sample's: Prometheus marks a series
		// stale only when a scrape without it comes, which a series
		// with timestamps of its own never gets.
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
		}
		gauge(sandboxCPUsDesc, float64(u.CPUCount))
		gauge(sandboxCPUDesc, u.CPUUsedPct/100)
		gauge(sandboxMemDesc, float64(u.MemUsed))
		gauge(sandboxMemLimitDesc, float64(u.MemTotal))
		gauge(sandboxDiskDesc, float64(u.DiskUsed))
		gauge(sandboxDiskMaxDesc, float64(u.DiskTotal))
	}
}

// collectNode exports node n's record. A lost node's figures are its
// last report's, which no longer hold: only its state and report time go.
func collectNode(ch chan<- prometheus.Metric, n cluster.NodeInfo) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, append([]string{n.ID}, labels...)...)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, n.ID)
	}
	gauge(nodeInfoDesc, 1, string(n.State), n.Runtime, n.RuntimeVersion, n.Version)
	if !n.UpdatedAt.IsZero() {
		gauge(nodeReportDesc, float64(n.UpdatedAt.UnixNano())/1e9)
	}
	if n.State == cluster.NodeLost {
		return
	}
	const mib = 1 << 20
	gauge(nodeCPUsDesc, float64(n.Capacity.CPUCount))
	gauge(nodeCPUsCommittedDesc, float64(n.Usage.CPUCount))
	gauge(nodeMemoryDesc, float64(n.Capacity.MemoryMB)*mib)
	gauge(nodeMemoryCommittedDesc, float64(n.Usage.CommittedMemoryMB)*mib)
	gauge(nodeMemoryUsedDesc, float64(n.Usage.MemoryMB)*mib)
	gauge(nodeHostMemoryDesc, float64(n.HostMemoryMB)*mib)
	gauge(nodeDiskDesc, float64(n.Capacity.DiskMB)*mib)
	gauge(nodeDiskUsedDesc, float64(n.Usage.DiskMB)*mib)
	gauge(nodeSandboxesDesc, float64(n.Sandboxes))
	for _, p := range n.Pool {
		if p.Prepared {
			gauge(nodePoolPreparedDesc, float64(p.Ready), p.TemplateID)
			continue
		}
		gauge(nodePoolDesc, float64(p.Ready), p.TemplateID, p.SnapshotID)
		gauge(nodePoolTargetDesc, float64(p.Target), p.TemplateID, p.SnapshotID)
	}
	if c := n.ImageCache; c != nil {
		gauge(nodeCacheBytesDesc, float64(c.Bytes))
		gauge(nodeCacheMaxDesc, float64(c.MaxBytes))
		counter(nodeCacheHitsDesc, float64(c.Hits))
		counter(nodeCacheMissesDesc, float64(c.Misses))
		counter(nodeCacheEvictionsDesc, float64(c.Evictions))
		gauge(nodeImagesMountedDesc, float64(c.Mounted))
	}
}
