package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
)

// What a node keeps of each running sandbox's past, in memory: bounded per
// sandbox. Once the sandbox leaves the node, its history goes to the
// node's endedStore (on disk), bounded by time and bytes, per node and per
// team.
const (
	// SampleEvery is how often sandboxes' resource use is sampled.
	SampleEvery = 5 * time.Second
	// fineSamples are the 5 s samples kept (an hour), coarseSamples the
	// one-a-minute ones before them (a day).
	fineSamples   = 720
	coarseSamples = 1440
	coarseEvery   = 12
	// maxLogEntries bounds a sandbox's own log (lifecycle events; envd's
	// process events come from envd's log while the sandbox runs).
	maxLogEntries = 1000
	// orphanAfter is how long a history may go without its sandbox
	// running here, nor ended, before it is taken for ended: an event
	// recorded as the sandbox went (a sample racing its kill) must not
	// stay in the heap for good.
	orphanAfter = time.Minute
)

// Sample is one reading of a sandbox's resource use.
type Sample struct {
	At                  time.Time
	CPUUsedPct          float64
	CPUCount            int
	MemUsed, MemTotal   uint64
	DiskUsed, DiskTotal uint64
}

// LogEntry is one line of a sandbox's log.
type LogEntry struct {
	At      time.Time
	Level   string
	Message string
	Fields  map[string]string
}

// history is one sandbox's samples and log.
type history struct {
	fine, coarse ring[Sample]
	logs         ring[LogEntry]
	taken        int
	ended        time.Time
	// team owns the sandbox: its ended history counts toward the team's
	// bound.
	team string
	// missing is since when the sandbox has been neither running here nor
	// ended (zero: it runs).
	missing time.Time
	// cpuAt and cpuNanos are the previous CPU reading.
	cpuAt    time.Time
	cpuNanos uint64
	// refused is the router's count of refused packets at the last
	// sample.
	refused uint64
	// active is when the sandbox was last seen in use, for the idle
	// policy.
	active activity
	// envd is how far envd's log has been read, and its events.
	envd envdCursor
}

// ring keeps the last cap items.
type ring[T any] struct {
	items []T
	next  int
	full  bool
}

func (r *ring[T]) add(v T, capacity int) {
	// The slice grows as items come (most sandboxes of an RL run live
	// seconds: a few samples and lines), up to capacity.
	if len(r.items) < capacity {
		r.items = append(r.items, v)
		return
	}
	r.items[r.next] = v
	r.next = (r.next + 1) % capacity
	r.full = true
}

// all returns the items oldest first.
func (r *ring[T]) all() []T {
	if !r.full {
		return append([]T(nil), r.items...)
	}
	return append(append([]T(nil), r.items[r.next:]...), r.items[:r.next]...)
}

// last returns the newest item, false if there is none.
func (r *ring[T]) last() (T, bool) {
	var zero T
	switch {
	case len(r.items) == 0:
		return zero, false
	case !r.full:
		return r.items[len(r.items)-1], true
	}
	return r.items[(r.next+len(r.items)-1)%len(r.items)], true
}

// histories holds the node's sandbox histories: those of its running
// sandboxes in memory, those of sandboxes that left in ended.
type histories struct {
	mu sync.Mutex
	by map[string]*history
	// ended is not guarded by mu.
	ended *endedStore
	log   *slog.Logger
}

// get returns sandbox id's history in memory, taking back what ended keeps
// of it (a sandbox resumed where it ran before, or an event that came
// after it ended). Called with h.mu held.
func (h *histories) get(id string) *history {
	if h.by == nil {
		h.by = map[string]*history{}
	}
	x := h.by[id]
	if x != nil {
		return x
	}
	x = &history{}
	h.by[id] = x
	if !h.ended.has(id) {
		return x
	}
	r, ok, err := h.ended.get(id)
	if err != nil {
		h.log.Warn("taking back an ended sandbox's history", "sandbox_id", id, "err", err)
	}
	if ok {
		x.team = r.Team
		for _, v := range r.Fine {
			x.fine.add(v, fineSamples)
		}
		for _, v := range r.Coarse {
			x.coarse.add(v, coarseSamples)
		}
		for _, v := range r.Logs {
			x.logs.add(v, maxLogEntries)
		}
		x.envd.keep(r.Envd)
		x.taken = len(r.Fine)
	}
	return x
}

// record is what is kept of h once sandbox id ended at. Called with the
// histories' mu held.
func (h *history) record(id string, at time.Time) *endedRecord {
	return &endedRecord{ID: id, Team: h.team, Ended: at, Fine: h.fine.all(), Coarse: h.coarse.all(), Logs: h.logs.all()}
}

// logEvent records something that happened to sandbox id.
func (n *Node) logEvent(id, level, msg string, kv ...string) {
	e := LogEntry{At: time.Now().UTC(), Level: level, Message: msg}
	if len(kv) > 0 {
		e.Fields = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			e.Fields[kv[i]] = kv[i+1]
		}
	}
	n.hist.mu.Lock()
	n.hist.get(id).logs.add(e, maxLogEntries)
	n.hist.mu.Unlock()
}

// historyStarted marks sandbox id, of team, as running here (again, for a
// paused sandbox restored where it ran before: its history goes on). envd's
// events before envdFrom, when set, are left out of it.
func (n *Node) historyStarted(id, team string, envdFrom time.Time) {
	n.hist.mu.Lock()
	h := n.hist.get(id)
	h.ended, h.missing, h.team = time.Time{}, time.Time{}, team
	h.active.restart(time.Now())
	n.hist.mu.Unlock()
	if !envdFrom.IsZero() {
		h.envd.skipBefore(envdFrom)
	}
	n.hist.ended.remove(id)
}

// historyEnded marks sandbox id as gone from this node: its history moves
// from the heap to the ended store, which keeps it within its bounds.
func (n *Node) historyEnded(id string) {
	n.hist.mu.Lock()
	h := n.hist.by[id]
	if h == nil {
		n.hist.mu.Unlock()
		return
	}
	h.ended = time.Now()
	r := h.record(id, h.ended)
	n.hist.mu.Unlock()
	// envd's events have a lock of their own (reading the log takes a
	// while); the last of them were read as the sandbox went.
	r.Envd = h.envd.advance(nil)
	err := n.hist.ended.put(r)
	if err != nil {
		// Lost rather than kept in the heap, which is what the store
		// bounds.
		n.log.Warn("keeping an ended sandbox's history; it is dropped", "sandbox_id", id, "err", err)
	}
	n.hist.mu.Lock()
	// Readers found it in memory until now; a sandbox started here again
	// meanwhile keeps it there.
	again := n.hist.by[id] != h || h.ended.IsZero()
	if !again {
		delete(n.hist.by, id)
	}
	n.hist.mu.Unlock()
	if again {
		n.hist.ended.remove(id)
	}
}

// sampleLoop samples every running sandbox every SampleEvery until the
// node closes, and drops histories past their retention.
func (n *Node) sampleLoop() {
	t := time.NewTicker(SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-n.bg.Done():
			return
		case <-t.C:
		}
		n.sampleAll(n.bg)
	}
}

func (n *Node) sampleAll(ctx context.Context) {
	running := n.List()
	for _, sb := range running {
		n.sample(ctx, sb)
	}
	n.reportIdle(running, time.Now())
	n.sweepHistories(running, time.Now())
	for _, id := range n.stuckBoots(time.Now()) {
		n.log.Warn("a boot has counted as in progress for too long; the warm pool does not refill while one does",
			"sandbox_id", id, "after", stuckBootAfter)
	}
}

// sweepHistories ends the histories in memory of sandboxes that have not
// run here for orphanAfter (running are those that do), and drops the
// ended ones past their retention.
func (n *Node) sweepHistories(running []*Sandbox, now time.Time) {
	live := make(map[string]bool, len(running))
	for _, sb := range running {
		live[sb.ID] = true
	}
	var orphans []string
	n.hist.mu.Lock()
	for id, h := range n.hist.by {
		switch {
		case live[id] || !h.ended.IsZero():
			h.missing = time.Time{}
		case h.missing.IsZero():
			h.missing = now
		case now.Sub(h.missing) > orphanAfter:
			orphans = append(orphans, id)
		}
	}
	n.hist.mu.Unlock()
	for _, id := range orphans {
		n.historyEnded(id)
	}
	n.hist.ended.sweep()
}

// sample reads sb's resource use into its history.
func (n *Node) sample(ctx context.Context, sb *Sandbox) {
	st, err := n.cfg.Runtime.Stats(ctx, sb.rt())
	if err != nil {
		return
	}
	var refused uint64
	rc, counts := n.cfg.Network.(interface {
		RefusedCount(*netns.Slot) (uint64, error)
	})
	if counts && sb.slot != nil {
		refused, _ = rc.RefusedCount(sb.slot)
	}
	packets, packetsOK := n.packetCount(sb)
	now := time.Now().UTC()
	n.hist.mu.Lock()
	h := n.hist.get(sb.ID)
	if h.team == "" {
		h.team = sb.Team // a sandbox taken over after a restart
	}
	s := Sample{At: now, CPUCount: sb.CPUCount, MemUsed: st.MemoryBytes, MemTotal: uint64(sb.MemoryMB) << 20,
		DiskUsed: st.DiskBytes, DiskTotal: uint64(max(sb.DiskMB, 0)) << 20}
	cpuKnown := !h.cpuAt.IsZero() && st.CPUUsageNanos >= h.cpuNanos && sb.CPUCount > 0
	if cpuKnown {
		el := now.Sub(h.cpuAt)
		s.CPUUsedPct = min(100, 100*float64(st.CPUUsageNanos-h.cpuNanos)/float64(el.Nanoseconds())/float64(sb.CPUCount))
	}
	h.active.observe(now, packets, packetsOK, s.CPUUsedPct, cpuKnown, n.cfg.Idle.busyPercent())
	h.cpuAt, h.cpuNanos = now, st.CPUUsageNanos
	h.fine.add(s, fineSamples)
	if h.taken%coarseEvery == 0 {
		h.coarse.add(s, coarseSamples)
	}
	h.taken++
	delta := refused - h.refused
	if refused < h.refused {
		delta = refused // a new slot (restored here again)
	}
	h.refused = refused
	if delta > 0 {
		h.logs.add(LogEntry{At: now, Level: "warn", Message: "egress refused by address",
			Fields: map[string]string{"packets": strconv.FormatUint(delta, 10)}}, maxLogEntries)
	}
	n.hist.mu.Unlock()
}

// LastSamples returns the last sample of each sandbox that runs here and
// was sampled: what a scrape of the cluster's per-sandbox gauges reads,
// so that it costs no runtime call. The histories of sandboxes gone are
// not in it.
func (n *Node) LastSamples() map[string]Sample {
	n.hist.mu.Lock()
	defer n.hist.mu.Unlock()
	out := make(map[string]Sample, len(n.hist.by))
	for id, h := range n.hist.by {
		if !h.ended.IsZero() {
			continue
		}
		if s, ok := h.fine.last(); ok {
			out[id] = s
		}
	}
	return out
}

// Metrics returns sandbox id's samples, oldest first.
func (n *Node) Metrics(id string) ([]Sample, error) {
	n.hist.mu.Lock()
	h := n.hist.by[id]
	var fine, coarse []Sample
	if h != nil {
		fine, coarse = h.fine.all(), h.coarse.all()
	}
	n.hist.mu.Unlock()
	if h == nil {
		r, ok, err := n.hist.ended.get(id)
		if err != nil {
			return nil, err
		}
		if !ok {
			if _, err := n.Get(id); err != nil {
				return nil, err
			}
			return nil, nil
		}
		fine, coarse = r.Fine, r.Coarse
	}
	var out []Sample
	for _, s := range coarse {
		if len(fine) == 0 || s.At.Before(fine[0].At) {
			out = append(out, s)
		}
	}
	return append(out, fine...), nil
}

// Logs returns sandbox id's log, oldest first: the node's events and the
// processes envd started and ended (read from envd's log while the sandbox
// runs, and kept after).
func (n *Node) Logs(id string) ([]LogEntry, error) {
	n.hist.mu.Lock()
	h := n.hist.by[id]
	var out []LogEntry
	var cur *envdCursor
	if h != nil {
		out, cur = h.logs.all(), &h.envd
	}
	n.hist.mu.Unlock()
	if h == nil {
		r, ok, err := n.hist.ended.get(id)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(r.Logs, r.Envd...)
			sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
			return out, nil
		}
		if _, err := n.Get(id); err != nil {
			return nil, err
		}
		cur = &envdCursor{} // a prestarted sandbox: nothing kept
	}
	out = append(out, n.readEnvdLog(n.runtimeIDOf(id), id, cur)...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}

// keepEnvdEvents reads the last of envd's log of sb into its history
// before the sandbox (and envd's log with it) goes.
func (n *Node) keepEnvdEvents(sb *Sandbox) {
	n.hist.mu.Lock()
	// Only sandboxes handed out have a history (not prestarted ones).
	h := n.hist.by[sb.ID]
	n.hist.mu.Unlock()
	if h != nil {
		n.readEnvdLog(sb.rt(), sb.ID, &h.envd)
	}
}

// runtimeIDOf is the runtime's name of sandbox id (Sandbox.rt) while it
// runs here, else id.
func (n *Node) runtimeIDOf(id string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if sb := n.sandboxes[id]; sb != nil {
		return sb.rt()
	}
	return id
}

// readEnvdLog advances cur over envd's log of sandbox id (rtID to the
// runtime), if it still has one, and returns the events read so far.
func (n *Node) readEnvdLog(rtID, id string, cur *envdCursor) []LogEntry {
	lr, ok := n.cfg.Runtime.(runtime.LogReader)
	if !ok {
		return nil
	}
	files, err := lr.EnvdLog(rtID)
	if err != nil {
		if !errors.Is(err, runtime.ErrNotFound) {
			n.log.Warn("reading envd's log", "sandbox_id", id, "err", err)
		}
		return cur.advance(nil)
	}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	return cur.advance(files)
}

// parseSlogText splits a log/slog text line into its keys and values
// (values quoted when they hold spaces or quotes). Written by hand: slog
// has no parser for its own text format.
func parseSlogText(line string) map[string]string {
	kv := map[string]string{}
	for line != "" {
		line = strings.TrimLeft(line, " ")
		eq := strings.IndexByte(line, '=')
		if eq <= 0 {
			break
		}
		key := line[:eq]
		line = line[eq+1:]
		var val string
		if strings.HasPrefix(line, `"`) {
			q, err := strconv.QuotedPrefix(line)
			if err != nil {
				break
			}
			val, _ = strconv.Unquote(q)
			line = line[len(q):]
		} else {
			end := strings.IndexByte(line, ' ')
			if end < 0 {
				end = len(line)
			}
			val, line = line[:end], line[end:]
		}
		kv[key] = val
	}
	return kv
}

// describeExit is the log line of a sandbox that died on its own.
func describeExit(e Exit) string {
	if e.OutOfMemory {
		return fmt.Sprintf("sandbox killed for running out of memory: %s", e.Reason)
	}
	return "sandbox exited: " + e.Reason
}
