package cluster

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// Keys of the node registry. A node's liveness is the leased key: it
// vanishes when the node stops renewing its lease; the known key outlives
// it, so that a node that died is reported lost rather than forgotten.
const (
	nodeLivePrefix  = "nodes/live/"
	nodeKnownPrefix = "nodes/known/"
	nodeDrainPrefix = "nodes/drain/"
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
	// node of a single-host server).
	Address string `json:"address,omitempty"`
	// State is filled in by Nodes from the lease and the drain mark.
	State     NodeState `json:"state"`
	Capacity  NodeUsage `json:"capacity"`
	Usage     NodeUsage `json:"usage"`
	Sandboxes int       `json:"sandboxes"`
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
	HostMemoryMB int       `json:"hostMemoryMB,omitempty"`
	UpdatedAt    time.Time `json:"updatedAt"`
}

// InfoFromWire is a node's description as the node API reports it.
func InfoFromWire(w *nodev1.NodeInfo) NodeInfo {
	res := func(r *nodev1.Resources) NodeUsage {
		return NodeUsage{CPUCount: int(r.GetCpuCount()), MemoryMB: int(r.GetMemoryMb()),
			CommittedMemoryMB: int(r.GetCommittedMemoryMb()), DiskMB: int(r.GetDiskMb())}
	}
	return NodeInfo{
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
	var last NodeInfo
	return func() NodeInfo {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if w, err := n.Info(ctx, &nodev1.InfoRequest{}); err == nil {
			last = InfoFromWire(w)
		}
		last.ID, last.Address = n.ID(), address
		return last
	}
}

// NodeUsage is an amount of a node's resources.
type NodeUsage struct {
	CPUCount int `json:"cpuCount"`
	MemoryMB int `json:"memoryMB"`
	// CommittedMemoryMB is the memory sandboxes are configured with
	// (usage only).
	CommittedMemoryMB int `json:"committedMemoryMB,omitempty"`
	DiskMB            int `json:"diskMB,omitempty"`
}

// nodeLeaseTTL is how long a node that stopped renewing stays ready.
const nodeLeaseTTL = 10 * time.Second

// nodeRefresh is how often a node reports its usage.
const nodeRefresh = 3 * time.Second

// Registration keeps a node's record in the registry; Stop ends it.
type Registration struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// RegisterNode puts report()'s record in the registry under a lease and
// returns once it is there; in the background the lease is renewed and
// the record rewritten every few seconds with fresh usage, until Stop
// (the record then expires with the lease, unless DeregisterNode removes
// it at once). A lost lease (the store unreachable for longer than its
// TTL) is taken again.
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
	r := &Registration{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			keepNode(bg, st, sess, report, log)
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

// keepNode rewrites the node's record under sess until ctx ends or the
// session is lost.
func keepNode(ctx context.Context, st state.Store, sess state.Session, report func() NodeInfo, log *slog.Logger) {
	tick := time.NewTicker(nodeRefresh)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-sess.Done():
			return
		case <-tick.C:
		}
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
		if _, err := st.Put(ctx, nodeKnownPrefix+info.ID, b, state.WriteOptions{}); err != nil {
			return info, err
		}
	}
	_, err = st.Put(ctx, nodeLivePrefix+info.ID, b, state.WriteOptions{Lease: sess.Lease()})
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
	err := st.Delete(ctx, nodeLivePrefix+id, 0)
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

// Nodes returns every node the cluster has known, with its state:
// draining if an operator drained it, lost if its lease expired, ready
// otherwise. A lost node shows what it last reported.
func (c *Cluster) Nodes(ctx context.Context) ([]NodeInfo, error) {
	entries, _, err := c.cfg.State.List(ctx, "nodes/")
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	reg := parseRegistry(entries)
	counts := map[string]int{}
	c.recs.each(func(r *record) {
		if r.State == StateRunning {
			counts[r.NodeID]++
		}
	})
	// One consistent list, and a node's known key is written before its
	// live one and never removed: every live node is known.
	var out []NodeInfo
	for id, n := range reg.known {
		if l, ok := reg.live[id]; ok {
			n, n.State = l, NodeReady
		} else {
			n.State = NodeLost
		}
		if reg.drained[id] && n.State == NodeReady {
			n.State = NodeDraining
		}
		n.ID, n.Sandboxes = id, counts[id]
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// registry is the node registry as read from the store.
type registry struct {
	live, known map[string]NodeInfo
	drained     map[string]bool
}

// parseRegistry decodes the entries under "nodes/".
func parseRegistry(entries []state.Entry) registry {
	reg := registry{live: map[string]NodeInfo{}, known: map[string]NodeInfo{}, drained: map[string]bool{}}
	for _, e := range entries {
		for prefix, into := range map[string]map[string]NodeInfo{nodeLivePrefix: reg.live, nodeKnownPrefix: reg.known} {
			if id, ok := strings.CutPrefix(e.Key, prefix); ok {
				var n NodeInfo
				if json.Unmarshal(e.Value, &n) == nil {
					into[id] = n
				}
			}
		}
		if id, ok := strings.CutPrefix(e.Key, nodeDrainPrefix); ok {
			reg.drained[id] = true
		}
	}
	return reg
}

// GetNode returns one node (ErrNotFound for an id never seen).
func (c *Cluster) GetNode(ctx context.Context, id string) (*NodeInfo, error) {
	all, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if all[i].ID == id {
			return &all[i], nil
		}
	}
	return nil, fmt.Errorf("%w: node %s", ErrNotFound, id)
}

// SetDraining marks a node draining (it takes no new sandboxes; its
// running ones keep running) or ready again.
func (c *Cluster) SetDraining(ctx context.Context, id string, draining bool) (*NodeInfo, error) {
	if _, err := c.GetNode(ctx, id); err != nil {
		return nil, err
	}
	var err error
	if draining {
		_, err = c.cfg.State.Put(ctx, nodeDrainPrefix+id, []byte(time.Now().UTC().Format(time.RFC3339)), state.WriteOptions{})
		c.log.Info("node draining: it takes no new sandboxes", "node_id", id)
	} else if err = c.cfg.State.Delete(ctx, nodeDrainPrefix+id, 0); errors.Is(err, state.ErrNotFound) {
		err = nil
	}
	if err != nil {
		return nil, fmt.Errorf("draining node %s: %w", id, err)
	}
	c.nodes.setDrained(id, draining) // placement here sees it at once
	return c.GetNode(ctx, id)
}

// tokenKey holds a hash of the cluster token: every server and node must
// hold the token itself.
const tokenKey = "cluster/token-sha256"

// ErrWrongToken: the cluster token given is not the cluster's.
var ErrWrongToken = errors.New("wrong cluster token")

// CheckToken makes sure token is the cluster's. The first server to come
// (adopt) records it; after that, a process whose token differs is
// refused (ErrWrongToken).
func CheckToken(ctx context.Context, st state.Store, token string, adopt bool) error {
	sum := sha256.Sum256([]byte(token))
	want := hex.EncodeToString(sum[:])
	e, err := st.Get(ctx, tokenKey)
	if errors.Is(err, state.ErrNotFound) && adopt {
		if _, err := st.Create(ctx, tokenKey, []byte(want), state.WriteOptions{}); err == nil {
			return nil
		} else if !errors.Is(err, state.ErrExists) {
			return fmt.Errorf("recording the cluster token: %w", err)
		}
		e, err = st.Get(ctx, tokenKey)
	}
	if errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("%w: the cluster has no token yet (start a server first)", ErrWrongToken)
	}
	if err != nil {
		return fmt.Errorf("checking the cluster token: %w", err)
	}
	if subtle.ConstantTimeCompare(e.Value, []byte(want)) != 1 {
		return fmt.Errorf("%w: it does not match the token the cluster was set up with", ErrWrongToken)
	}
	return nil
}

// drainOnStop is the drain mark of a node that drains itself as it stops
// (operators' marks hold a time).
const drainOnStop = "on-stop"

// MarkStopping marks node id draining because it is stopping: placement
// skips it at once. ClearStopping, at its next start, removes that mark
// (and only that one: an operator's drain outlives restarts).
func MarkStopping(ctx context.Context, st state.Store, id string) error {
	if _, err := st.Put(ctx, nodeDrainPrefix+id, []byte(drainOnStop), state.WriteOptions{}); err != nil {
		return fmt.Errorf("marking node %s draining: %w", id, err)
	}
	return nil
}

// ClearStopping removes the mark MarkStopping left.
func ClearStopping(ctx context.Context, st state.Store, id string) error {
	e, err := st.Get(ctx, nodeDrainPrefix+id)
	if errors.Is(err, state.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading node %s's drain mark: %w", id, err)
	}
	if string(e.Value) != drainOnStop {
		return nil
	}
	if err := st.Delete(ctx, nodeDrainPrefix+id, e.Revision); err != nil && !errors.Is(err, state.ErrNotFound) && !errors.Is(err, state.ErrConflict) {
		return fmt.Errorf("clearing node %s's drain mark: %w", id, err)
	}
	return nil
}
