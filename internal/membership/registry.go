package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// Keys of the node registry, all under RegistryPrefix. A node's liveness
// is the leased key: it vanishes when the node stops renewing its lease;
// the known key outlives it, so that a node that died is reported lost
// rather than forgotten. A drain mark holds the time an operator drained
// the node, or the mark of a node stopping (MarkStopping).
const (
	RegistryPrefix = "nodes/"
	LivePrefix     = "nodes/live/"
	KnownPrefix    = "nodes/known/"
	DrainPrefix    = "nodes/drain/"
)

// NodeState is what a node is doing, as operators see it.
type NodeState string

// Node states.
const (
	NodeReady    NodeState = "ready"
	NodeDraining NodeState = "draining"
	NodeLost     NodeState = "lost"
)

// NodeInfo is what a node reports about itself: what it has, what it
// uses, what it runs on.
type NodeInfo struct {
	ID string `json:"id"`
	// Address is where the node's API is reached ("" for the in-process
	// node of a server that advertises none).
	Address string `json:"address,omitempty"`
	// Instance tells this node's process lineage from another's that
	// claims the same id (LoadInstance).
	Instance string `json:"instance,omitempty"`
	// TLS: the node serves Address over mutual TLS with a certificate of
	// the cluster's CA naming its id (servers dial it so); else plain
	// HTTP with the cluster token.
	TLS bool `json:"tls,omitempty"`
	// State is filled in by the registry's reader (cluster.Nodes) from
	// the lease and the drain mark.
	State     NodeState `json:"state"`
	Capacity  NodeUsage `json:"capacity"`
	Usage     NodeUsage `json:"usage"`
	Sandboxes int       `json:"sandboxes"`
	// Pooled counts the sandboxes its warm pool holds prestarted (their
	// memory is in Usage's committed), Pool each template's or
	// snapshot's share.
	Pooled int         `json:"pooled"`
	Pool   []PoolEntry `json:"pool,omitempty"`
	// Runtime and RuntimeVersion name the driver; snapshots restore only
	// where they match.
	Runtime        string `json:"runtime"`
	RuntimeVersion string `json:"runtimeVersion,omitempty"`
	Version        string `json:"version,omitempty"`
	// Templates are the templates the node holds (ids and aliases).
	Templates []string `json:"templates,omitempty"`
	// Images are the block images its sandboxes run on.
	Images []string `json:"images,omitempty"`
	// MemoryOvercommit and MemoryHighWater are the node's admission rule,
	// which placement applies to its reports.
	MemoryOvercommit float64 `json:"memoryOvercommit,omitempty"`
	MemoryHighWater  float64 `json:"memoryHighWater,omitempty"`
	// HostMemoryMB is the host's physical memory, of which Usage.MemoryMB
	// is really in use (Capacity may offer less).
	HostMemoryMB int `json:"hostMemoryMB,omitempty"`
	// ImageCache is the node's block image cache as its last report had
	// it (nil: the node serves no block images, or its image server did
	// not answer that report).
	ImageCache *ImageCache `json:"imageCache,omitempty"`
	UpdatedAt  time.Time   `json:"updatedAt"`
}

// ImageCache is a node's cache of block image chunks: what it holds
// against its bound, and its reads since its image server started (a hit
// ratio is Hits / (Hits + Misses)).
type ImageCache struct {
	Bytes     int64 `json:"bytes"`
	MaxBytes  int64 `json:"maxBytes"`
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Evictions int64 `json:"evictions"`
	// Mounted counts the images mounted on the node.
	Mounted int `json:"mounted"`
}

// PoolEntry is a node's warm pool of one template or snapshot (exactly
// one of the two is set).
type PoolEntry struct {
	TemplateID string `json:"templateID,omitempty"`
	SnapshotID string `json:"snapshotID,omitempty"`
	// Ready is how many prestarted sandboxes it holds; Target how many it
	// is sized to, from its recent peak burst of creates.
	Ready  int `json:"ready"`
	Target int `json:"target"`
	// Prepared: these are the template's prepared sandboxes, which
	// restores of its sandboxes load their state into (not counted in
	// Pooled, and no create takes one).
	Prepared bool `json:"prepared,omitempty"`
}

// InfoFromWire is a node's description as the node API reports it.
func InfoFromWire(w *nodev1.NodeInfo) NodeInfo {
	res := func(r *nodev1.Resources) NodeUsage {
		return NodeUsage{CPUCount: int(r.GetCpuCount()), MemoryMB: int(r.GetMemoryMb()),
			CommittedMemoryMB: int(r.GetCommittedMemoryMb()), DiskMB: int(r.GetDiskMb())}
	}
	var pool []PoolEntry
	pooled := 0
	for _, e := range w.Pool {
		pool = append(pool, PoolEntry{TemplateID: e.TemplateId, SnapshotID: e.SnapshotId, Ready: int(e.Ready), Target: int(e.Target),
			Prepared: e.Prepared})
		if !e.Prepared {
			pooled += int(e.Ready)
		}
	}
	var cache *ImageCache
	if c := w.ImageCache; c != nil {
		cache = &ImageCache{Bytes: int64(c.Bytes), MaxBytes: int64(c.MaxBytes), Hits: int64(c.Hits), Misses: int64(c.Misses),
			Evictions: int64(c.Evictions), Mounted: int(c.Mounted)}
	}
	return NodeInfo{
		ImageCache:       cache,
		Pooled:           pooled,
		Pool:             pool,
		ID:               w.Id,
		Capacity:         res(w.Capacity),
		Usage:            res(w.Usage),
		Sandboxes:        int(w.Sandboxes),
		Runtime:          w.Runtime,
		RuntimeVersion:   w.RuntimeVersion,
		Version:          w.Version,
		Templates:        w.Templates,
		Images:           w.Images,
		MemoryOvercommit: w.MemoryOvercommit,
		MemoryHighWater:  w.MemoryHighWater,
		HostMemoryMB:     int(w.HostMemoryMb),
	}
}

// Reporter is the report function RegisterNode wants for node n, reached
// at address ("" for an in-process node). A report that fails repeats
// the last good one.
func Reporter(n nodeapi.Node, address string) func() NodeInfo {
	return InstanceReporter(n, address, "")
}

// InstanceReporter is Reporter for a node of instance (LoadInstance),
// whose registration refuses an id another live instance holds.
func InstanceReporter(n nodeapi.Node, address, instance string) func() NodeInfo {
	return TLSReporter(n, address, instance, false)
}

// TLSReporter is InstanceReporter for a node that says whether it serves
// mutual TLS (NodeInfo.TLS).
func TLSReporter(n nodeapi.Node, address, instance string, tls bool) func() NodeInfo {
	var last NodeInfo
	return func() NodeInfo {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if w, err := n.Info(ctx, &nodev1.InfoRequest{}); err == nil {
			last = InfoFromWire(w)
		}
		last.ID, last.Address, last.Instance, last.TLS = n.ID(), address, instance, tls
		return last
	}
}

// NodeUsage is an amount of a node's resources.
type NodeUsage struct {
	CPUCount int `json:"cpuCount"`
	MemoryMB int `json:"memoryMB"`
	// CommittedMemoryMB is the memory sandboxes are configured with
	// (usage only); in usage, CPUCount is their vCPUs.
	CommittedMemoryMB int `json:"committedMemoryMB,omitempty"`
	DiskMB            int `json:"diskMB,omitempty"`
}

// nodeLeaseTTL is how long a node that stopped renewing stays ready.
const nodeLeaseTTL = 10 * time.Second

// ReportInterval is how often a registered node reports its usage (the
// cluster bounds what it assumes between two reports by it).
const ReportInterval = 3 * time.Second

// nudgeSpacing is the least time between two reports a Nudge brings
// forward: nudges in a burst of creates coalesce into a few writes.
const nudgeSpacing = 250 * time.Millisecond

// Registration keeps a node's record in the registry; Stop ends it.
type Registration struct {
	cancel context.CancelFunc
	done   chan struct{}
	nudge  chan struct{}
}

// Nudge asks for the node's next report now rather than at the next
// interval (at most one per nudgeSpacing): for a change the cluster
// schedules by, such as a template's warm pool running out or filling
// again. It never blocks.
func (r *Registration) Nudge() {
	select {
	case r.nudge <- struct{}{}:
	default:
	}
}

// RegisterNode puts report()'s record in the registry under a lease and
// returns once it is there; in the background the lease is renewed and
// the record rewritten every few seconds with fresh usage, until Stop
// (the record then expires with the lease, unless DeregisterNode removes
// it at once). A lost lease (the store unreachable for longer than its
// TTL) is taken again. An id that another live instance holds is refused
// (ErrNodeIDTaken; see claimID), which may take a lease's time to tell.
func RegisterNode(ctx context.Context, st state.Store, report func() NodeInfo, log *slog.Logger) (*Registration, error) {
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// The session lives until Stop, not until the caller's ctx ends.
	sess, err := st.NewSession(bg, nodeLeaseTTL)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("registering node: %w", err)
	}
	info, err := putNode(ctx, st, sess, report, true)
	if err != nil {
		cancel()
		sess.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("registering node %s: %w", info.ID, err)
	}
	r := &Registration{cancel: cancel, done: make(chan struct{}), nudge: make(chan struct{}, 1)}
	go func() {
		defer close(r.done)
		for {
			keepNode(bg, st, sess, report, r.nudge, log)
			if bg.Err() != nil {
				return
			}
			log.Warn("node lease lost; registering again", "node_id", info.ID)
			for {
				if sess, err = st.NewSession(bg, nodeLeaseTTL); err == nil {
					break
				}
				if bg.Err() != nil {
					return
				}
				log.Warn("registering node", "node_id", info.ID, "err", err)
				sleepCtx(bg, time.Second)
			}
		}
	}()
	return r, nil
}

// keepNode rewrites the node's record under sess every ReportInterval,
// and on a nudge no sooner than nudgeSpacing after the last, until ctx
// ends or the session is lost.
func keepNode(ctx context.Context, st state.Store, sess state.Session, report func() NodeInfo, nudge <-chan struct{}, log *slog.Logger) {
	tick := time.NewTicker(ReportInterval)
	defer tick.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-sess.Done():
			return
		case <-tick.C:
		case <-nudge:
			if wait := nudgeSpacing - time.Since(last); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
			}
		}
		last = time.Now()
		if info, err := putNode(ctx, st, sess, report, false); err != nil && ctx.Err() == nil {
			log.Warn("reporting node", "node_id", info.ID, "err", err)
		}
	}
}

// putNode writes the node's live record (and, first, its known one).
func putNode(ctx context.Context, st state.Store, sess state.Session, report func() NodeInfo, first bool) (NodeInfo, error) {
	info := report()
	info.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(info)
	if err != nil {
		return info, err
	}
	if first {
		if err := claimID(ctx, st, info); err != nil {
			return info, err
		}
		if _, err := st.Put(ctx, KnownPrefix+info.ID, b, state.WriteOptions{}); err != nil {
			return info, err
		}
	}
	_, err = st.Put(ctx, LivePrefix+info.ID, b, state.WriteOptions{Lease: sess.Lease()})
	return info, err
}

// Stop ends the registration's renewals and waits for them.
func (r *Registration) Stop() {
	r.cancel()
	<-r.done
}

// DeregisterNode removes a node's live record, for a node that stops on
// purpose: the others need not wait for its lease to expire.
func DeregisterNode(ctx context.Context, st state.Store, id string) error {
	err := st.Delete(ctx, LivePrefix+id, 0)
	if err != nil && !errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("deregistering node %s: %w", id, err)
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
