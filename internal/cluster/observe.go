package cluster

import (
	"context"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	sched "github.com/aenvhq/aenv/internal/placement"
)

// What the cluster counts and reads for monitoring (the API's /metrics):
// the package keeps no metrics registry of its own, so these are plain
// figures its callers export.

// Refusal causes beyond placement's (sched.Causes).
const (
	// RefusedByNode: a node chosen refused the sandbox for lack of room
	// (its report was older than its admission), and the create moved on
	// to another node if one was left to try.
	RefusedByNode = "node_refused"
	// RefusedNodeLeft: every node chosen left while the sandbox was
	// placed.
	RefusedNodeLeft = "node_left"
)

// RefusalCauses lists every cause PlacementRefusals counts.
func RefusalCauses() []string {
	out := make([]string, 0, len(sched.Causes)+2)
	for _, c := range sched.Causes {
		out = append(out, string(c))
	}
	return append(out, RefusedByNode, RefusedNodeLeft)
}

// refusalCounts counts the placements refused, by cause.
type refusalCounts struct {
	mu sync.Mutex
	by map[string]uint64
}

func (r *refusalCounts) add(cause string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by == nil {
		r.by = map[string]uint64{}
	}
	r.by[cause]++
}

// PlacementRefusals counts, by cause (every one of RefusalCauses, zero
// included), the placements this server refused since it opened the
// cluster: creates, resumes, forks and migrations that found no node, and
// nodes that refused what placement chose for them.
func (c *Cluster) PlacementRefusals() map[string]uint64 {
	r := &c.nodes.refusals
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]uint64{}
	for _, cause := range RefusalCauses() {
		out[cause] = r.by[cause]
	}
	return out
}

// SandboxUsage is a running sandbox's resource use, as its node last
// sampled it (every 5 s).
type SandboxUsage struct {
	ID, NodeID, TemplateID string
	// At is when the sample was taken.
	At time.Time
	// CPUCount is its vCPUs, CPUUsedPct how busy they were (0-100) over
	// the node's last sampling interval.
	CPUCount   int
	CPUUsedPct float64
	// MemUsed and DiskUsed are the bytes it uses of its MemTotal and
	// DiskTotal (zero: no bound).
	MemUsed, MemTotal, DiskUsed, DiskTotal uint64
}

// usageTimeout bounds a node's answer to SandboxUsage: a node slow to
// answer is left out of a scrape rather than hold it past its deadline.
const usageTimeout = 3 * time.Second

// SandboxUsage asks every node this server reaches, all at once, for the
// last sample of each sandbox it runs (one List per node, answered from
// the node's memory). A node that does not answer is left out. Sandboxes
// are only the running ones: a sandbox that ended, or paused, is not in
// it.
func (c *Cluster) SandboxUsage(ctx context.Context) []SandboxUsage {
	nodes := c.nodes.reachable()
	results := make([][]SandboxUsage, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { results[i] = usageOf(ctx, n) })
	}
	wg.Wait()
	var out []SandboxUsage
	for _, r := range results {
		out = append(out, r...)
	}
	return out
}

func usageOf(ctx context.Context, n nodeapi.Node) []SandboxUsage {
	ctx, cancel := context.WithTimeout(ctx, usageTimeout)
	defer cancel()
	l, err := n.List(ctx, &nodev1.ListRequest{Usage: true})
	if err != nil {
		return nil
	}
	var out []SandboxUsage
	for _, sb := range l.Sandboxes {
		u := sb.Usage
		if u == nil {
			continue // not sampled yet, or a node that does not report it
		}
		out = append(out, SandboxUsage{ID: sb.Id, NodeID: n.ID(), TemplateID: sb.TemplateId, At: u.Timestamp.AsTime(),
			CPUCount: int(u.CpuCount), CPUUsedPct: u.CpuUsedPct, MemUsed: u.MemUsed, MemTotal: u.MemTotal,
			DiskUsed: u.DiskUsed, DiskTotal: u.DiskTotal})
	}
	return out
}
