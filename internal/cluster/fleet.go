package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// fleet is this server's view of the cluster's nodes: the registry in the
// store, followed by a watch, and a connection to each live node (its
// node API and its event stream). Placement reads it, so that choosing a
// node costs no round trip.
type fleet struct {
	st    state.Store
	log   *slog.Logger
	local nodeapi.Node
	dial  func(id, address string) nodeapi.Node
	// onEvent receives every event of every node, with the node's id.
	onEvent func(nodeID string, ev *nodev1.Event)

	mu      sync.Mutex
	members map[string]*member
	drained map[string]bool
	// loadedAt is when the registry was first read: a node named by a
	// record but never seen since counts as lost from then.
	loadedAt time.Time
	ctx      context.Context
}

// member is one node as the fleet knows it.
type member struct {
	info NodeInfo
	live bool
	// lostAt is when its lease was seen to expire (zero while live).
	lostAt time.Time
	api    nodeapi.Node
	// stop ends the subscription to its events.
	stop context.CancelFunc
}

// unsubscribe ends the member's event subscription, if any.
func (m *member) unsubscribe() {
	if m.stop != nil {
		m.stop()
		m.stop = nil
	}
}

func newFleet(st state.Store, local nodeapi.Node, dial func(id, address string) nodeapi.Node, log *slog.Logger) *fleet {
	f := &fleet{st: st, log: log, local: local, dial: dial, members: map[string]*member{}, drained: map[string]bool{}}
	return f
}

// addLocal makes the in-process node a ready member, with what it reports
// now: it takes sandboxes before its registration comes back through the
// watch.
func (f *fleet) addLocal(ctx context.Context) error {
	info, err := f.local.Info(ctx, &nodev1.InfoRequest{})
	if err != nil {
		return fmt.Errorf("describing the local node: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := &member{info: InfoFromWire(info), live: true, api: f.local}
	f.members[f.local.ID()] = m
	f.subscribeLocked(m.info.ID, m)
	return nil
}

// start reads the registry and follows it until ctx ends.
func (f *fleet) start(ctx context.Context, wg *sync.WaitGroup) error {
	f.mu.Lock()
	f.ctx = ctx
	f.mu.Unlock()
	if f.local != nil {
		if err := f.addLocal(ctx); err != nil {
			return err
		}
	}
	rev, err := f.load(ctx)
	if err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		state.Follow(ctx, f.st, "nodes/", rev, f.load, f.apply, func(err error) { f.log.Warn("following the node registry", "err", err) })
	}()
	return nil
}

// load replaces the fleet's view with the registry as it is now.
func (f *fleet) load(ctx context.Context) (int64, error) {
	entries, rev, err := f.st.List(ctx, "nodes/")
	if err != nil {
		return 0, fmt.Errorf("loading the node registry: %w", err)
	}
	reg := parseRegistry(entries)
	live, drained := reg.live, reg.drained
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loadedAt.IsZero() {
		f.loadedAt = time.Now()
	}
	f.drained = drained
	for id, m := range f.members {
		if _, ok := live[id]; !ok && m.live {
			f.lostLocked(id, m)
		}
	}
	for id, n := range live {
		f.liveLocked(id, n)
	}
	return rev, nil
}

func (f *fleet) apply(ev state.Event) {
	key := ev.Entry.Key
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case strings.HasPrefix(key, nodeLivePrefix):
		id := strings.TrimPrefix(key, nodeLivePrefix)
		if ev.Type == state.EventDelete {
			if m, ok := f.members[id]; ok && m.live {
				f.lostLocked(id, m)
			}
			return
		}
		var n NodeInfo
		if json.Unmarshal(ev.Entry.Value, &n) == nil {
			f.liveLocked(id, n)
		}
	case strings.HasPrefix(key, nodeDrainPrefix):
		f.drained[strings.TrimPrefix(key, nodeDrainPrefix)] = ev.Type == state.EventPut
	}
}

// liveLocked records node id's latest report, connecting to it if it is
// new (or back).
func (f *fleet) liveLocked(id string, n NodeInfo) {
	m := f.members[id]
	if m == nil {
		m = &member{}
		f.members[id] = m
	}
	wasLive := m.live
	if m.api != nil && m.api != f.local && n.Address != m.info.Address {
		// It came back elsewhere: reach it there.
		m.unsubscribe()
		m.api = nil
	}
	m.info, m.live, m.lostAt = n, true, time.Time{}
	if m.api == nil && n.Address != "" && f.dial != nil {
		m.api = f.dial(id, n.Address)
	}
	// Without an address it is another server's in-process node, which
	// only that server reaches.
	if m.api != nil && m.stop == nil {
		f.subscribeLocked(id, m)
	}
	if !wasLive {
		f.log.Info("node ready", "node_id", id, "address", n.Address)
	}
}

// lostLocked marks a node whose lease expired (or that deregistered). The
// in-process node is never lost to its own server.
func (f *fleet) lostLocked(id string, m *member) {
	if m.api != nil && m.api == f.local {
		return
	}
	m.live, m.lostAt = false, time.Now()
	m.unsubscribe()
	m.api = nil
	f.log.Warn("node lost: its lease in the registry expired or it left", "node_id", id)
}

// subscribeLocked follows node id's events until its member stops them,
// reconnecting after a broken stream.
func (f *fleet) subscribeLocked(id string, m *member) {
	if f.ctx == nil || f.onEvent == nil {
		return
	}
	ctx, cancel := context.WithCancel(f.ctx)
	m.stop = cancel
	api := m.api
	go func() {
		backoff := 500 * time.Millisecond
		for ctx.Err() == nil {
			start := time.Now()
			err := api.Events(ctx, func(ev *nodev1.Event) { f.onEvent(id, ev) })
			if ctx.Err() != nil {
				return
			}
			if time.Since(start) > 10*time.Second {
				backoff = 500 * time.Millisecond
			}
			f.log.Debug("node event stream ended; reconnecting", "node_id", id, "err", err, "retry_in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}()
}

// setDrained records a drain mark this server wrote.
func (f *fleet) setDrained(id string, drained bool) {
	f.mu.Lock()
	f.drained[id] = drained
	f.mu.Unlock()
}

// runtimeOf is the runtime and version node id reports.
func (f *fleet) runtimeOf(id string) (string, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := f.members[id]; ok {
		return m.info.Runtime, m.info.RuntimeVersion
	}
	return "", ""
}

// stopAll ends every event subscription.
func (f *fleet) stopAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.members {
		m.unsubscribe()
	}
}

// node returns the API of node id, if this server can reach it.
func (f *fleet) node(id string) (nodeapi.Node, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.members[id]
	switch {
	case !ok:
		return nil, fmt.Errorf("%w: node %s is not in the registry", ErrUnavailable, id)
	case m.api == nil && m.live:
		return nil, fmt.Errorf("%w: node %s runs inside another server and cannot be reached from this one", ErrUnavailable, id)
	case m.api == nil:
		return nil, fmt.Errorf("%w: node %s is lost", ErrUnavailable, id)
	}
	return m.api, nil
}

// address is where node id's API and sandbox traffic are reached ("" for
// the in-process node).
func (f *fleet) address(id string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.members[id]
	if !ok || m.api == nil {
		return "", false
	}
	if m.api == f.local {
		return "", true
	}
	return m.info.Address, true
}

// lostBefore reports, for any node id, whether that node was lost at
// cutoff or earlier: a member lost since then, or a node this server has
// never seen (named only by records) once the registry was read by then.
// The in-process node is never lost to its own server. It answers from a
// copy, so that a scan of every record takes no lock per record.
func (f *fleet) lostBefore(cutoff time.Time) func(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	lost, known := map[string]bool{}, map[string]bool{}
	for id, m := range f.members {
		known[id] = true
		if !m.live && !m.lostAt.After(cutoff) {
			lost[id] = true
		}
	}
	unknownLost := !f.loadedAt.IsZero() && !f.loadedAt.After(cutoff)
	local := ""
	if f.local != nil {
		local = f.local.ID()
	}
	return func(id string) bool {
		return id != local && (lost[id] || (unknownLost && !known[id]))
	}
}

// any returns a reachable node for what every node answers alike (the
// snapshot catalog, shared through the store): the in-process one if
// there is one.
func (f *fleet) any() (nodeapi.Node, error) {
	if f.local != nil {
		return f.local, nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var ids []string
	for id, m := range f.members {
		if m.live && m.api != nil {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: no node is ready", ErrNoCapacity)
	}
	return f.members[ids[rand.IntN(len(ids))]].api, nil
}

// NodeAddress is where node id's API and sandbox traffic are reached
// ("" for the in-process node); false if it is not live.
func (c *Cluster) NodeAddress(id string) (string, bool) { return c.nodes.address(id) }

// reachable returns every node this server can call.
func (f *fleet) reachable() []nodeapi.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []nodeapi.Node
	for _, m := range f.members {
		if m.api != nil {
			out = append(out, m.api)
		}
	}
	return out
}

// placement is what a new sandbox needs of its node.
type placement struct {
	// template is what it starts from; nodes that hold it are preferred
	// (required, when some node holds it).
	template       string
	memoryMB, cpus int
	// runtime and runtimeVersion, when set, must match the node's (a
	// restore of a saved state).
	runtime, runtimeVersion string
	// prefer is tried first if it can take the sandbox (where a paused
	// sandbox's image or a fork's source already is).
	prefer string
	// exclude lists nodes already tried.
	exclude []string
	// only, when set, is the one node allowed.
	only string
}

// describe names where p may go, for errors.
func (p placement) describe() string {
	if p.only != "" {
		return p.only
	}
	return "another node"
}

// placeSamples is K in best-of-K: two random candidates, the one with
// more headroom wins. It spreads load nearly as well as scanning every
// node, at constant cost, and servers placing at once rarely collide.
const placeSamples = 2

// defaultMemoryMB is the memory assumed for a sandbox that takes its
// template's (the template's size is known only to its nodes).
const defaultMemoryMB = 512

// place picks the node for a new sandbox: among ready nodes (live, not
// draining, holding the template, with a matching runtime) that have room
// by their own admission rule, the best of placeSamples random ones by
// memory headroom. A sandbox larger than every node is ErrInvalid; one
// that fits nowhere now is ErrNoCapacity, saying what ran out.
func (f *fleet) place(p placement) (nodeapi.Node, error) {
	if p.memoryMB <= 0 {
		p.memoryMB = defaultMemoryMB
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	type cand struct {
		id       string
		m        *member
		headroom int
	}
	var fits, holders []cand
	ready, draining, tooSmall, full, hot := 0, 0, 0, 0, 0
	largestMB, largestCPU := 0, 0
	var why string
	for id, m := range f.members {
		if !m.live || m.api == nil || slices.Contains(p.exclude, id) || (p.only != "" && id != p.only) {
			continue
		}
		if f.drained[id] {
			draining++
			continue
		}
		n := m.info
		if p.runtime != "" && (n.Runtime != p.runtime || n.RuntimeVersion != p.runtimeVersion) {
			continue
		}
		ready++
		largestMB, largestCPU = max(largestMB, n.Capacity.MemoryMB), max(largestCPU, n.Capacity.CPUCount)
		if p.memoryMB > n.Capacity.MemoryMB || p.cpus > n.Capacity.CPUCount {
			tooSmall++
			continue
		}
		over := n.MemoryOvercommit
		if over <= 0 {
			over = 4
		}
		limit := int(over * float64(n.Capacity.MemoryMB))
		headroom := limit - n.Usage.CommittedMemoryMB - p.memoryMB
		if headroom < 0 {
			full++
			why = fmt.Sprintf("node %s has %d of %d MiB committed", id, n.Usage.CommittedMemoryMB, limit)
			continue
		}
		// The high-water mark is of the host's memory, as the node's own
		// admission applies it.
		if hw := n.MemoryHighWater; hw > 0 && n.HostMemoryMB > 0 &&
			float64(n.Usage.MemoryMB) > hw*float64(n.HostMemoryMB) {
			hot++
			why = fmt.Sprintf("node %s's host uses %d of %d MiB of memory", id, n.Usage.MemoryMB, n.HostMemoryMB)
			continue
		}
		c := cand{id, m, headroom}
		fits = append(fits, c)
		if p.template != "" && slices.Contains(n.Templates, p.template) {
			holders = append(holders, c)
		}
	}
	if len(holders) > 0 {
		fits = holders
	}
	if len(fits) == 0 {
		if p.only != "" {
			if m, ok := f.members[p.only]; !ok || !m.live {
				return nil, fmt.Errorf("%w: node %s is not ready", ErrNotFound, p.only)
			}
			if f.drained[p.only] {
				return nil, fmt.Errorf("%w: node %s is draining", ErrNoCapacity, p.only)
			}
		}
		switch {
		case ready == 0 && draining > 0:
			return nil, fmt.Errorf("%w: every node is draining (%d)", ErrNoCapacity, draining)
		case ready == 0 && p.runtime != "":
			return nil, fmt.Errorf("%w: no ready node runs %s %s, which saved this sandbox", ErrNoCapacity, p.runtime, p.runtimeVersion)
		case ready == 0:
			return nil, fmt.Errorf("%w: no node is ready", ErrNoCapacity)
		case tooSmall == ready:
			return nil, fmt.Errorf("%w: the sandbox (%d MiB, %d CPUs) is larger than every node (the largest has %d MiB, %d CPUs)",
				ErrInvalid, p.memoryMB, p.cpus, largestMB, largestCPU)
		default:
			return nil, fmt.Errorf("%w: no node has room for %d MiB more (%d full, %d above their memory high-water mark; %s)",
				ErrNoCapacity, p.memoryMB, full, hot, why)
		}
	}
	for _, c := range fits {
		if c.id == p.prefer {
			return c.m.api, nil
		}
	}
	best := fits[rand.IntN(len(fits))]
	for range placeSamples - 1 {
		if c := fits[rand.IntN(len(fits))]; c.headroom > best.headroom {
			best = c
		}
	}
	return best.m.api, nil
}
