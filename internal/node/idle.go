package node

import (
	"fmt"
	"sort"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
)

// DefaultIdleCPUPercent is the CPU use, in percent of a sandbox's CPUs over
// one sample, from which it counts as busy though it has no traffic: a
// sleeping process and gVisor's own timers stay well under it, a job that
// computes without talking to anyone does not.
const DefaultIdleCPUPercent = 5

// idleResend is how long a sandbox reported idle waits before it is
// reported again while it stays idle: the cluster may have missed the
// event (a leader changing) or failed to pause it (a quota).
const idleResend = time.Minute

// pressureQuiet is how long a sandbox must have been quiet before memory
// pressure makes it a candidate: one that answered a request a moment ago
// is about to get the next.
const pressureQuiet = 30 * time.Second

// Idle is a sandbox the node reports as worth pausing: quiet for the
// node's idle period, or the idlest while the host's memory is short.
type Idle struct {
	ID string
	// Quiet is how long it has had no traffic and next to no CPU.
	Quiet time.Duration
	// Pressure: reported for the host's memory, not its own idle period.
	Pressure bool
	// Reason says which, for the log.
	Reason string
}

// IdlePolicy says when the node reports sandboxes idle.
type IdlePolicy struct {
	// After is the quiet period after which a sandbox is reported idle;
	// 0 reports none for being quiet.
	After time.Duration
	// CPUPercent is the use from which a sandbox counts as busy; 0 means
	// DefaultIdleCPUPercent.
	CPUPercent float64
	// UnderPressure reports the idlest sandbox (quiet for pressureQuiet at
	// least), one per sample, while the host's memory use is above the
	// admission rule's high-water mark, so that pausing it makes room
	// before the kernel's OOM killer would.
	UnderPressure bool
}

// on reports whether p reports anything, and so whether the node needs
// its sandboxes' packet counts.
func (p IdlePolicy) on() bool { return p.After > 0 || p.UnderPressure }

func (p IdlePolicy) busyPercent() float64 {
	if p.CPUPercent <= 0 {
		return DefaultIdleCPUPercent
	}
	return p.CPUPercent
}

// activity is what a sandbox's history knows of its last use.
type activity struct {
	// at is the last sample that saw traffic or CPU at or above the busy
	// mark (or the sandbox's start).
	at time.Time
	// packets is its slot's packet count at the last sample; known is
	// false until a first reading (a new slot's count starts anew).
	packets uint64
	known   bool
	// reported is when it was last reported idle.
	reported time.Time
}

// observe updates a from one sample: packets is the slot's count (ok
// false: unreadable, which counts as traffic, since a sandbox whose traffic
// cannot be seen must never be paused for having none), cpuPct the
// sample's CPU use (cpuKnown false on the first sample).
func (a *activity) observe(now time.Time, packets uint64, ok bool, cpuPct float64, cpuKnown bool, busyPct float64) {
	switch {
	case a.at.IsZero(), !ok, a.known && packets != a.packets, cpuKnown && cpuPct >= busyPct:
		a.at = now
	}
	a.packets, a.known = packets, ok
}

// restart is a sandbox (re)starting here: its start is activity, and its
// slot's count starts anew.
func (a *activity) restart(now time.Time) {
	*a = activity{at: now}
}

// idleCandidate is one running sandbox's activity, for idleReports.
type idleCandidate struct {
	id       string
	activity activity
}

// idleReports is what the node reports of its running sandboxes at now,
// under policy p, with memUsed the fraction of the host's memory in use
// (negative: unknown) and highWater the admission rule's mark.
func idleReports(p IdlePolicy, cands []idleCandidate, memUsed, highWater float64, now time.Time) []Idle {
	var out []Idle
	reported := map[string]bool{}
	due := func(a activity) bool { return now.Sub(a.reported) >= idleResend }
	if p.After > 0 {
		for _, c := range cands {
			quiet := now.Sub(c.activity.at)
			if quiet < p.After || !due(c.activity) {
				continue
			}
			reported[c.id] = true
			out = append(out, Idle{ID: c.id, Quiet: quiet, Reason: fmt.Sprintf(
				"idle: no traffic and under %g%% CPU for %s", p.busyPercent(), quiet.Round(time.Second))})
		}
	}
	if p.UnderPressure && memUsed > highWater {
		quietest := make([]idleCandidate, 0, len(cands))
		for _, c := range cands {
			if !reported[c.id] && due(c.activity) && now.Sub(c.activity.at) >= pressureQuiet {
				quietest = append(quietest, c)
			}
		}
		sort.Slice(quietest, func(i, j int) bool { return quietest[i].activity.at.Before(quietest[j].activity.at) })
		if len(quietest) > 0 {
			c := quietest[0]
			quiet := now.Sub(c.activity.at)
			out = append(out, Idle{ID: c.id, Quiet: quiet, Pressure: true, Reason: fmt.Sprintf(
				"memory pressure: host memory %.0f%% used, above the %.0f%% high-water mark; the idlest sandbox, quiet for %s",
				100*memUsed, 100*highWater, quiet.Round(time.Second))})
		}
	}
	return out
}

// OnIdle registers fn to be told of the sandboxes the idle policy reports
// (Config.Idle), from the sampling loop: fn must not block.
func (n *Node) OnIdle(fn func(Idle)) {
	n.mu.Lock()
	n.onIdle = fn
	n.mu.Unlock()
}

// OnPoolChange has fn called when a template's (or snapshot's) warm pool
// runs out or holds a sandbox again: the node's report to the cluster,
// whose scheduler prefers a node with a pooled sandbox, is then stale.
// fn is called with the pool's lock held and must not block.
func (n *Node) OnPoolChange(fn func()) { n.onPoolChange.Store(&fn) }

// poolChanged calls OnPoolChange's fn, if any.
func (n *Node) poolChanged() {
	if fn := n.onPoolChange.Load(); fn != nil {
		(*fn)()
	}
}

// packetCount reads sb's slot's packet count, if the network counts them
// and the idle policy needs them (a netlink request per sandbox and
// sample, not made for nothing).
func (n *Node) packetCount(sb *Sandbox) (uint64, bool) {
	if !n.cfg.Idle.on() {
		return 0, false
	}
	pc, ok := n.cfg.Network.(interface {
		PacketCount(*netns.Slot) (uint64, error)
	})
	if !ok || sb.slot == nil {
		return 0, false
	}
	c, err := pc.PacketCount(sb.slot)
	return c, err == nil
}

// reportIdle tells OnIdle's callback which of running are idle at now.
func (n *Node) reportIdle(running []*Sandbox, now time.Time) {
	n.mu.Lock()
	fn := n.onIdle
	n.mu.Unlock()
	p := n.cfg.Idle
	if fn == nil || !p.on() {
		return
	}
	memUsed := -1.0
	if p.UnderPressure {
		_, memUsed = n.load.memory()
	}
	cands := make([]idleCandidate, 0, len(running))
	n.hist.mu.Lock()
	for _, sb := range running {
		if h := n.hist.by[sb.ID]; h != nil {
			cands = append(cands, idleCandidate{id: sb.ID, activity: h.active})
		}
	}
	n.hist.mu.Unlock()
	reports := idleReports(p, cands, memUsed, n.cfg.Capacity.MemoryHighWater, now)
	if len(reports) == 0 {
		return
	}
	n.hist.mu.Lock()
	for _, r := range reports {
		if h := n.hist.by[r.ID]; h != nil {
			h.active.reported = now
		}
	}
	n.hist.mu.Unlock()
	for _, r := range reports {
		n.log.Info("sandbox idle; asking for it to be paused", "sandbox_id", r.ID, "reason", r.Reason)
		fn(r)
	}
}
