package node

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
)

// What a node keeps of each sandbox's past, in memory: bounded per sandbox,
// and dropped HistoryRetention after the sandbox left the node.
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
	// HistoryRetention is how long a sandbox's history outlives it here.
	HistoryRetention = time.Hour
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
	// cpuAt and cpuNanos are the previous CPU reading.
	cpuAt    time.Time
	cpuNanos uint64
	// refused is the router's count of refused packets at the last
	// sample.
	refused uint64
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
	if r.items == nil {
		r.items = make([]T, 0, min(capacity, 64))
	}
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

// histories holds the node's sandbox histories.
type histories struct {
	mu sync.Mutex
	by map[string]*history
}

func (h *histories) get(id string) *history {
	if h.by == nil {
		h.by = map[string]*history{}
	}
	x := h.by[id]
	if x == nil {
		x = &history{}
		h.by[id] = x
	}
	return x
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

// historyStarted marks sandbox id as running here (again, for a paused
// sandbox restored where it ran before).
func (n *Node) historyStarted(id string) {
	n.hist.mu.Lock()
	n.hist.get(id).ended = time.Time{}
	n.hist.mu.Unlock()
}

// historyEnded marks sandbox id as gone from this node (its history stays for
// HistoryRetention).
func (n *Node) historyEnded(id string) {
	n.hist.mu.Lock()
	if h := n.hist.by[id]; h != nil {
		h.ended = time.Now()
	}
	n.hist.mu.Unlock()
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
	for _, sb := range n.List() {
		n.sample(ctx, sb)
	}
	n.hist.mu.Lock()
	for id, h := range n.hist.by {
		if !h.ended.IsZero() && time.Since(h.ended) > HistoryRetention {
			delete(n.hist.by, id)
		}
	}
	n.hist.mu.Unlock()
}

// sample reads sb's resource use into its history.
func (n *Node) sample(ctx context.Context, sb *Sandbox) {
	st, err := n.cfg.Runtime.Stats(ctx, sb.ID)
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
	now := time.Now().UTC()
	n.hist.mu.Lock()
	h := n.hist.get(sb.ID)
	s := Sample{At: now, CPUCount: sb.CPUCount, MemUsed: st.MemoryBytes, MemTotal: uint64(sb.MemoryMB) << 20,
		DiskUsed: st.DiskBytes, DiskTotal: uint64(max(sb.DiskMB, 0)) << 20}
	if !h.cpuAt.IsZero() && st.CPUUsageNanos >= h.cpuNanos && sb.CPUCount > 0 {
		el := now.Sub(h.cpuAt)
		s.CPUUsedPct = min(100, 100*float64(st.CPUUsageNanos-h.cpuNanos)/float64(el.Nanoseconds())/float64(sb.CPUCount))
	}
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

// Metrics returns sandbox id's samples, oldest first.
func (n *Node) Metrics(id string) ([]Sample, error) {
	n.hist.mu.Lock()
	defer n.hist.mu.Unlock()
	h := n.hist.by[id]
	if h == nil {
		if _, err := n.Get(id); err != nil {
			return nil, err
		}
		return nil, nil
	}
	fine := h.fine.all()
	var out []Sample
	for _, s := range h.coarse.all() {
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
		if _, err := n.Get(id); err != nil {
			return nil, err
		}
		cur = &envdCursor{} // a prestarted sandbox: nothing kept
	}
	out = append(out, n.readEnvdLog(id, cur)...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out, nil
}

// keepEnvdEvents reads the last of envd's log of sandbox id into its
// history before the sandbox (and envd's log with it) goes.
func (n *Node) keepEnvdEvents(id string) {
	n.hist.mu.Lock()
	// Only sandboxes handed out have a history (not prestarted ones).
	h := n.hist.by[id]
	n.hist.mu.Unlock()
	if h != nil {
		n.readEnvdLog(id, &h.envd)
	}
}

// readEnvdLog advances cur over envd's log of sandbox id, if it still
// has one, and returns the events read so far.
func (n *Node) readEnvdLog(id string, cur *envdCursor) []LogEntry {
	lr, ok := n.cfg.Runtime.(runtime.LogReader)
	if !ok {
		return nil
	}
	files, err := lr.EnvdLog(id)
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
