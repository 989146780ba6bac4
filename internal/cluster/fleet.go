package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/capacity"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	sched "github.com/aenvhq/aenv/internal/placement"
	"github.com/aenvhq/aenv/internal/state"
)

// fleet is this server's view of the cluster's nodes: the registry in the
// store, followed by a watch, and a connection to each live node (its
// node API and its event stream). Placement chooses from a snapshot of it,
// so that choosing a node costs no round trip and holds no lock.
type fleet struct {
	st    state.Store
	log   *slog.Logger
	local nodeapi.Node
	dial  func(id, address string) nodeapi.Node
	// onEvent receives every event of every node, with the node's id.
	onEvent func(nodeID string, ev *nodev1.Event)
	// alg chooses among the nodes.
	alg sched.Algorithm

	mu      sync.Mutex
	members map[string]*member
	drained map[string]bool
	// wrote holds the drain marks this server wrote whose own watch
	// events have not come back yet: until then an older event of that
	// mark (a drain just before an undrain) must not undo it.
	wrote map[string]drainWrite
	// loadedAt is when the registry was first read: a node named by a
	// record but never seen since counts as lost from then.
	loadedAt time.Time
	// bg owns the event subscriptions (nil until start).
	bg *tasks
	// snap is what placement chooses from: every reachable live node.
	// Placements share it and never change it. A change of membership or
	// drain marks drops it (nil), and the next placement builds it anew;
	// a report or a placement marks its member stale, and the next
	// placement patches a copy.
	snap  []*sched.Node
	stale []*member
	// placed are the members with placements counted on them, which
	// lapse at the earliest at lapse.
	placed []*member
	lapse  time.Time
	// evacuating are the nodes whose sandboxes are being moved away.
	evacuating map[string]bool
	// refusals counts the placements refused (PlacementRefusals).
	refusals refusalCounts
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
	// placedMB is the memory of the sandboxes this server placed on it
	// since its last report: a burst of creates sees its own placements
	// at once, not when the node reports them seconds later. Without a
	// report it lapses at placedUntil.
	placedMB    int
	placedUntil time.Time
	// poolTaken counts, by pool (and prepared) key, the creates (and
	// restores) this server placed on it since its last report that its
	// warm pool may have served: the rest of a burst goes where
	// prestarted (or prepared) sandboxes are left.
	poolTaken map[string]int
	// inPlaced: it is in the fleet's placed.
	inPlaced bool
	// cand is the member as placement sees it (nil: to build again), at
	// slot in the fleet's snap (-1: not there).
	cand *sched.Node
	slot int
}

// unsubscribe ends the member's event subscription, if any.
func (m *member) unsubscribe() {
	if m.stop != nil {
		m.stop()
		m.stop = nil
	}
}

func newFleet(st state.Store, local nodeapi.Node, dial func(id, address string) nodeapi.Node, log *slog.Logger) *fleet {
	f := &fleet{st: st, log: log, local: local, dial: dial, members: map[string]*member{}, drained: map[string]bool{}, wrote: map[string]drainWrite{},
		alg: sched.NewBestOfK(sched.DefaultK, nil), evacuating: map[string]bool{}}
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
	m := &member{info: InfoFromWire(info), live: true, api: f.local, slot: -1}
	f.members[f.local.ID()] = m
	f.snap = nil
	f.subscribeLocked(m.info.ID, m)
	return nil
}

// start reads the registry and follows it, and the nodes' events, in
// tasks of bg until it closes.
func (f *fleet) start(bg *tasks) error {
	f.mu.Lock()
	f.bg = bg
	f.mu.Unlock()
	if f.local != nil {
		if err := f.addLocal(bg.ctx); err != nil {
			return err
		}
	}
	rev, err := f.load(bg.ctx)
	if err != nil {
		return err
	}
	bg.Go(func(ctx context.Context) {
		state.Follow(ctx, f.st, "nodes/", rev, f.load, f.apply, func(err error) { f.log.Warn("following the node registry", "err", err) })
	})
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
	clear(f.wrote) // the registry as read is as new as they are
	f.snap = nil
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
		id := strings.TrimPrefix(key, nodeDrainPrefix)
		drained := ev.Type == state.EventPut
		if w, ok := f.wrote[id]; ok {
			if drained != w.drained && time.Now().Before(w.until) {
				return // older than the mark this server wrote
			}
			delete(f.wrote, id) // its own event, or it waited long enough
		}
		f.drained[id] = drained
		f.snap = nil
	}
}

// liveLocked records node id's latest report, connecting to it if it is
// new (or back).
func (f *fleet) liveLocked(id string, n NodeInfo) {
	m := f.members[id]
	if m == nil {
		m = &member{slot: -1}
		f.members[id] = m
	}
	wasLive := m.live
	if m.api != nil && m.api != f.local && n.Address != m.info.Address {
		// It came back elsewhere: reach it there.
		m.unsubscribe()
		m.api = nil
	}
	// The report counts what was placed before it (or nearly: a create
	// that ends as the node reports counts from its next report on).
	m.info, m.live, m.lostAt, m.placedMB, m.poolTaken = n, true, time.Time{}, 0, nil
	f.changedLocked(m)
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
	f.snap = nil
	f.log.Warn("node lost: its lease in the registry expired or it left", "node_id", id)
}

// subscribeLocked follows node id's events until its member stops them,
// reconnecting after a broken stream.
func (f *fleet) subscribeLocked(id string, m *member) {
	if f.bg == nil || f.onEvent == nil {
		return
	}
	ctx, cancel := context.WithCancel(f.bg.ctx)
	m.stop = cancel
	api := m.api
	if !f.bg.Go(func(context.Context) { f.follow(ctx, id, api) }) {
		cancel() // the cluster is closing
	}
}

// follow passes node id's events to onEvent until ctx ends, reconnecting
// after a broken stream.
func (f *fleet) follow(ctx context.Context, id string, api nodeapi.Node) {
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
}

// setDrained marks node id drained or not here, at once.
func (f *fleet) setDrained(id string, drained bool) {
	f.mu.Lock()
	f.drained[id] = drained
	f.snap = nil
	f.mu.Unlock()
}

// drainWrite is a drain mark this server wrote (see fleet.wrote).
type drainWrite struct {
	drained bool
	// until bounds how long its event may take to come back: a watch
	// that lost it (and did not reload) must not freeze the mark.
	until time.Time
}

// drainEventWait is how long the fleet waits for the event of a drain
// mark it wrote before it takes the watch's word again.
const drainEventWait = 10 * time.Second

// wroteDrain is setDrained for a mark this server has just written to the
// store, whose watch event will follow: events that still say otherwise
// are older, and are ignored until it comes.
func (f *fleet) wroteDrain(id string, drained bool) {
	f.mu.Lock()
	f.drained[id] = drained
	f.wrote[id] = drainWrite{drained: drained, until: time.Now().Add(drainEventWait)}
	f.snap = nil
	f.mu.Unlock()
}

// beginEvacuation marks node id's sandboxes as being moved away; false if
// that is under way already (the node repeats that it is going away).
func (f *fleet) beginEvacuation(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.evacuating[id] {
		return false
	}
	f.evacuating[id] = true
	return true
}

// endEvacuation clears beginEvacuation's mark.
func (f *fleet) endEvacuation(id string) {
	f.mu.Lock()
	delete(f.evacuating, id)
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
		return nil, fmt.Errorf("%w: node %s runs inside another server that advertises no address, and cannot be reached from this one (give that server --advertise)", ErrUnavailable, id)
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

// cpus is the CPUs of the live nodes that take new sandboxes (only's
// alone when set), what a fan-out of restores sizes itself by.
func (f *fleet) cpus(only string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	total := 0
	for id, m := range f.members {
		if !m.live || m.api == nil || f.drained[id] || (only != "" && id != only) {
			continue
		}
		total += m.info.Capacity.CPUCount
	}
	return total
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
	// pool is its key in the nodes' warm pools (poolKey; empty: no
	// prestarted sandbox fits it), whose holders come first.
	pool string
	// prepared is, for a restore, the key of the prepared sandboxes of its
	// template (preparedKey), whose holders come next.
	prepared string
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

// toRequest is p as the placement package takes it.
func (p placement) toRequest() sched.Request {
	return sched.Request{Template: p.template, MemoryMB: p.memoryMB, CPUs: p.cpus, Runtime: p.runtime,
		RuntimeVersion: p.runtimeVersion, Prefer: p.prefer, Pool: p.pool, Prepared: p.prepared, Exclude: p.exclude, Only: p.only}
}

// poolKey is the key of a template's (or snapshot's) prestarted
// sandboxes in placement's view of the nodes' warm pools.
func poolKey(templateID, snapshotID string) string {
	if snapshotID != "" {
		return "s/" + snapshotID
	}
	return "t/" + templateID
}

// preparedKey is the key of a template's prepared sandboxes (which
// restores of its sandboxes load their state into) in placement's view of
// the nodes' warm pools.
func preparedKey(templateID string) string { return "r/" + templateID }

// pooled is what m's warm pool holds for placement, by poolKey and
// preparedKey, less what this server placed on it since its report (nil:
// nothing).
func (m *member) pooled() map[string]int {
	var out map[string]int
	for _, e := range m.info.Pool {
		k := poolKey(e.TemplateID, e.SnapshotID)
		if e.Prepared {
			k = preparedKey(e.TemplateID)
		}
		if left := e.Ready - m.poolTaken[k]; left > 0 {
			if out == nil {
				out = map[string]int{}
			}
			out[k] = left
		}
	}
	return out
}

// candidate is member id as placement sees it: its report, with what was
// placed on it since.
func (m *member) candidate(id string, draining bool) *sched.Node {
	if m.cand != nil && m.cand.Draining == draining {
		return m.cand
	}
	n := m.info
	used := -1.0 // unknown
	if n.HostMemoryMB > 0 {
		used = float64(n.Usage.MemoryMB) / float64(n.HostMemoryMB)
	}
	m.cand = &sched.Node{
		ID: id,
		Rule: capacity.Rule{MemoryMB: n.Capacity.MemoryMB, CPUCount: n.Capacity.CPUCount,
			MemoryOvercommit: n.MemoryOvercommit, MemoryHighWater: n.MemoryHighWater},
		// The disk's high-water mark is the node's own setting, which it
		// does not report: the node applies it, and placement moves on to
		// another node when it refuses.
		Load:    capacity.Load{CommittedMB: n.Usage.CommittedMemoryMB + m.placedMB, MemoryUsed: used, DiskUsed: -1},
		Runtime: n.Runtime, RuntimeVersion: n.RuntimeVersion, Templates: n.Templates, Pooled: m.pooled(),
		Draining: draining,
	}
	return m.cand
}

// placedFor bounds how long a placement counts on its node without the
// node's report, which normally comes within nodeRefresh: a node whose
// reports this server stopped hearing is not left looking full.
const placedFor = 2 * nodeRefresh

// placedLocked counts mb more on m until its next report.
func (f *fleet) placedLocked(m *member, mb int) {
	m.placedMB += mb
	m.placedUntil = time.Now().Add(placedFor)
	if !m.inPlaced {
		m.inPlaced = true
		if len(f.placed) == 0 {
			f.lapse = m.placedUntil
		}
		f.placed = append(f.placed, m)
	}
	f.changedLocked(m)
}

// left counts a sandbox of mb that stopped running on node id (killed,
// paused, died) off that node until its next report: placements count on
// until the report, and so must departures, or a full node stays full
// for this server up to a report period after a sandbox left it.
func (f *fleet) left(id string, mb int) {
	if mb <= 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.members[id]; m != nil && m.live {
		f.placedLocked(m, -mb)
	}
}

// lapseLocked drops the placements counted past placedFor without a
// report.
func (f *fleet) lapseLocked(now time.Time) {
	if len(f.placed) == 0 || now.Before(f.lapse) {
		return
	}
	keep := f.placed[:0]
	f.lapse = now.Add(placedFor)
	for _, m := range f.placed {
		switch {
		case m.placedMB == 0: // reported since
			m.inPlaced = false
		case now.After(m.placedUntil):
			m.placedMB, m.inPlaced, m.poolTaken = 0, false, nil
			f.changedLocked(m)
		default:
			keep = append(keep, m)
			if m.placedUntil.Before(f.lapse) {
				f.lapse = m.placedUntil
			}
		}
	}
	clear(f.placed[len(keep):])
	f.placed = keep
}

// changedLocked marks what placement sees of m as out of date.
func (f *fleet) changedLocked(m *member) {
	m.cand = nil
	in := m.live && m.api != nil
	switch {
	case f.snap == nil:
	case m.slot >= 0 && in:
		f.stale = append(f.stale, m)
	case m.slot >= 0 || in:
		f.snap = nil // it joins the snapshot, or leaves it
	}
}

// candidatesLocked is the snapshot placement chooses from: every live
// node this server reaches. At a thousand nodes reporting every few
// seconds and creates in a burst, nearly every placement finds a member
// changed: it copies the snapshot's pointers and rebuilds those members
// only.
func (f *fleet) candidatesLocked() []*sched.Node {
	f.lapseLocked(time.Now())
	switch {
	case f.snap == nil:
		snap := make([]*sched.Node, 0, len(f.members))
		for id, m := range f.members {
			m.slot = -1
			if m.live && m.api != nil {
				m.slot = len(snap)
				snap = append(snap, m.candidate(id, f.drained[id]))
			}
		}
		f.snap, f.stale = snap, f.stale[:0]
	case len(f.stale) > 0:
		snap := slices.Clone(f.snap)
		for _, m := range f.stale {
			snap[m.slot] = m.candidate(snap[m.slot].ID, snap[m.slot].Draining)
		}
		f.snap, f.stale = snap, f.stale[:0]
	}
	return f.snap
}

// place picks the node for a new sandbox with the placement package, from
// a snapshot of the fleet: among ready nodes (live, not draining, holding
// the template, with a matching runtime) that have room by their own
// admission rule, the best of two random ones by memory headroom. The
// sandbox's memory counts on that node from now until its next report. A
// sandbox larger than every node is ErrInvalid; one that fits nowhere now
// is ErrNoCapacity, saying what ran out; an only node that is not live is
// ErrNotFound.
func (f *fleet) place(p placement) (nodeapi.Node, error) {
	req := p.toRequest()
	// A node may be lost between the choice and its reservation: choose
	// again from the snapshot without it.
	for range 3 {
		f.mu.Lock()
		if p.only != "" {
			if m, ok := f.members[p.only]; !ok || !m.live {
				f.mu.Unlock()
				f.refusals.add(string(sched.CauseNoNode))
				return nil, fmt.Errorf("%w: node %s is not ready", ErrNotFound, p.only)
			}
		}
		nodes := f.candidatesLocked()
		f.mu.Unlock()

		n, err := f.alg.Place(req, nodes)
		var r *sched.Refusal
		if errors.As(err, &r) {
			f.refusals.add(string(r.Cause))
		}
		switch {
		case err == nil:
		case r != nil && errors.Is(r.Kind, sched.ErrTooLarge):
			return nil, fmt.Errorf("%w: %s", ErrInvalid, r.Reason)
		case r != nil:
			return nil, fmt.Errorf("%w: %s", ErrNoCapacity, r.Reason)
		default:
			return nil, fmt.Errorf("placing a sandbox: %w", err)
		}

		f.mu.Lock()
		if m := f.members[n.ID]; m != nil && m.live && m.api != nil {
			if req.Pool != "" && n.Pooled[req.Pool] > 0 {
				if m.poolTaken == nil {
					m.poolTaken = map[string]int{}
				}
				m.poolTaken[req.Pool]++
				// The prestarted sandbox it takes is in the node's
				// commitment already: counting it again would refuse a
				// batch the pool holds.
				f.changedLocked(m)
			} else {
				if req.Prepared != "" && n.Pooled[req.Prepared] > 0 {
					// The rest of a fork's children go where prepared
					// sandboxes are left.
					if m.poolTaken == nil {
						m.poolTaken = map[string]int{}
					}
					m.poolTaken[req.Prepared]++
				}
				f.placedLocked(m, req.Memory())
			}
			f.mu.Unlock()
			return m.api, nil
		}
		f.mu.Unlock()
	}
	f.refusals.add(RefusedNodeLeft)
	return nil, fmt.Errorf("%w: the nodes chosen left while the sandbox was placed", ErrNoCapacity)
}
