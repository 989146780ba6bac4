// Package placement chooses the node for a new sandbox, in three steps:
// Filter keeps the nodes that may take it (the request's constraints, then
// each node's own admission rule from internal/capacity), a score ranks
// them (Headroom), and an Algorithm picks one. BestOfK is the first
// Algorithm. Among the nodes that may take it, those with a prestarted
// sandbox of what it starts from in their warm pool come first (Warm): a
// create there skips the boot; then, for a restore, those with a prepared
// sandbox of its template, whose processes a restore there need not
// start.
//
// It is pure: it decides from the snapshot of nodes it is handed, and
// reads no clock, store or network, so that it is tested and measured
// alone and the caller holds no lock while it decides. It imports only
// capacity; the cluster's fleet cache calls it.
package placement

import (
	"errors"
	"fmt"
	"slices"

	"github.com/aenvhq/aenv/internal/capacity"
)

// Node is one candidate as the scheduler last heard of it. A snapshot's
// Nodes are shared by concurrent placements: nothing here changes them.
type Node struct {
	ID string
	// Rule is the node's admission rule as it reports it (zero fractions
	// take capacity's defaults, as the node's own do).
	Rule capacity.Rule
	// Load is what it holds now: its report, plus what was placed on it
	// since.
	Load capacity.Load
	// Runtime and RuntimeVersion name its driver.
	Runtime, RuntimeVersion string
	// Templates are the templates it holds (ids and aliases).
	Templates []string
	// Pooled counts the prestarted and prepared sandboxes its warm pool
	// holds, by Request.Pool and Request.Prepared key (what was placed on
	// it since its report taken off).
	Pooled map[string]int
	// Draining nodes take no new sandboxes.
	Draining bool
}

// Request is what a new sandbox needs of its node.
type Request struct {
	// Template is what it starts from; nodes that hold it are required
	// when some node holds it, any node otherwise (it pulls it).
	Template string
	// MemoryMB (DefaultMemoryMB when zero) and CPUs it is configured with.
	MemoryMB, CPUs int
	// Runtime and RuntimeVersion, when set, must match the node's (a
	// restore of a saved state).
	Runtime, RuntimeVersion string
	// Prefer is taken first if it can take the sandbox (where a paused
	// sandbox's image or a fork's source already is).
	Prefer string
	// Pool, when set, is the key of what the sandbox starts from in the
	// nodes' warm pools (Node.Pooled): nodes holding one come before the
	// others.
	Pool string
	// Prepared, when set, is the key (in Node.Pooled) of the prepared
	// sandboxes a restore of it can load its state into: when no node
	// holds one of Pool, nodes holding one of these come first. Unlike a
	// prestarted sandbox, a prepared one holds none of the sandbox's
	// memory, which counts as usual.
	Prepared string
	// Exclude lists nodes already tried.
	Exclude []string
	// Only, when set, is the one node allowed.
	Only string
}

// DefaultMemoryMB is the memory assumed for a sandbox that takes its
// template's (the template's size is known only to its nodes).
const DefaultMemoryMB = 512

// Memory is the memory the sandbox is placed with.
func (r Request) Memory() int {
	if r.MemoryMB <= 0 {
		return DefaultMemoryMB
	}
	return r.MemoryMB
}

func (r Request) capacity() capacity.Request {
	return capacity.Request{MemoryMB: r.Memory(), CPUs: r.CPUs}
}

// Kinds of Refusal.
var (
	// ErrNoCapacity: no node can take the sandbox now (worth retrying).
	ErrNoCapacity = errors.New("no capacity")
	// ErrTooLarge: the sandbox is larger than every node (it never fits).
	ErrTooLarge = errors.New("too large")
)

// Cause is why no node could take a sandbox, as a word of a fixed set:
// what a count of refusals is labelled with (Refusal.Reason says more,
// for people).
type Cause string

// Causes of a Refusal.
const (
	// CauseDraining: every node that could take it is draining (or the
	// one it must go to is).
	CauseDraining Cause = "draining"
	// CauseRuntime: no ready node runs the runtime its saved state needs.
	CauseRuntime Cause = "runtime"
	// CauseNoNode: no node is ready.
	CauseNoNode Cause = "no_node"
	// CauseTooLarge: it is larger than every node.
	CauseTooLarge Cause = "too_large"
	// CauseNoRoom: the nodes are full (memory committed, host memory
	// above its high-water mark, disk full).
	CauseNoRoom Cause = "no_room"
)

// Causes lists every Cause.
var Causes = []Cause{CauseDraining, CauseRuntime, CauseNoNode, CauseTooLarge, CauseNoRoom}

// Refusal is why no node can take a sandbox.
type Refusal struct {
	// Kind is ErrNoCapacity or ErrTooLarge.
	Kind error
	// Cause is the reason's class.
	Cause Cause
	// Reason says what ran out, for people.
	Reason string
}

func (r *Refusal) Error() string { return r.Kind.Error() + ": " + r.Reason }

// Unwrap makes errors.Is see the Kind.
func (r *Refusal) Unwrap() error { return r.Kind }

func refuse(kind error, cause Cause, format string, args ...any) *Refusal {
	return &Refusal{Kind: kind, Cause: cause, Reason: fmt.Sprintf(format, args...)}
}

// Algorithm picks the node for a sandbox from a snapshot of the nodes, or
// says why none may take it (a *Refusal). Implementations are safe for
// concurrent use.
type Algorithm interface {
	Place(req Request, nodes []*Node) (*Node, error)
}

// Filter returns the nodes that may take req now: not excluded (Exclude,
// Only), not draining, with a matching runtime, taking it by their
// admission rule; of those, only the ones that hold its template if any
// does. When none may, the *Refusal says why, from the most telling
// reason: every node draining, none with the runtime, the sandbox larger
// than every node, or what ran out where.
func Filter(req Request, nodes []*Node) ([]*Node, error) {
	creq := req.capacity()
	// One slice, for what a placement at a thousand nodes allocates: the
	// nodes that fit, compacted to the template's holders if any.
	fits, holders := make([]*Node, 0, len(nodes)), 0
	ready, draining, tooSmall, full, hot := 0, 0, 0, 0, 0
	largestMB, largestCPU := 0, 0
	var why string
	for _, n := range nodes {
		if (req.Only != "" && n.ID != req.Only) || slices.Contains(req.Exclude, n.ID) {
			continue
		}
		if n.Draining {
			draining++
			continue
		}
		if req.Runtime != "" && (n.Runtime != req.Runtime || !capacity.Restorable(req.RuntimeVersion, n.RuntimeVersion)) {
			continue
		}
		ready++
		rule := n.Rule.WithDefaults()
		largestMB, largestCPU = max(largestMB, rule.MemoryMB), max(largestCPU, rule.CPUCount)
		load := n.Load
		if req.Pool != "" && n.Pooled[req.Pool] > 0 {
			// It takes a prestarted sandbox, whose memory the node's
			// commitment counts already.
			load.CommittedMB = max(load.CommittedMB-creq.MemoryMB, 0)
		}
		switch rule.Check(creq, load) {
		case capacity.TooLarge:
			tooSmall++
			continue
		case capacity.OverCommitted:
			full++
			why = fmt.Sprintf("node %s has %d of %d MiB committed", n.ID, n.Load.CommittedMB, rule.CommitLimitMB())
			continue
		case capacity.MemoryHot:
			hot++
			why = fmt.Sprintf("node %s's host memory is %.0f%% used", n.ID, 100*n.Load.MemoryUsed)
			continue
		case capacity.DiskFull:
			full++
			why = fmt.Sprintf("node %s's sandbox disk is %.0f%% full", n.ID, 100*n.Load.DiskUsed)
			continue
		}
		fits = append(fits, n)
		if req.Template != "" && slices.Contains(n.Templates, req.Template) {
			holders++
		}
	}
	if holders > 0 && holders < len(fits) {
		fits = slices.DeleteFunc(fits, func(n *Node) bool { return !slices.Contains(n.Templates, req.Template) })
	}
	if len(fits) > 0 {
		return fits, nil
	}
	if req.Only != "" {
		for _, n := range nodes {
			if n.ID == req.Only && n.Draining {
				return nil, refuse(ErrNoCapacity, CauseDraining, "node %s is draining", req.Only)
			}
		}
	}
	switch {
	case ready == 0 && draining > 0:
		return nil, refuse(ErrNoCapacity, CauseDraining, "every node is draining (%d)", draining)
	case ready == 0 && req.Runtime != "":
		return nil, refuse(ErrNoCapacity, CauseRuntime, "no ready node runs %s %s, which saved this sandbox", req.Runtime, req.RuntimeVersion)
	case ready == 0:
		return nil, refuse(ErrNoCapacity, CauseNoNode, "no node is ready")
	case tooSmall == ready:
		return nil, refuse(ErrTooLarge, CauseTooLarge, "the sandbox (%d MiB, %d CPUs) is larger than every node (the largest has %d MiB, %d CPUs)",
			creq.MemoryMB, creq.CPUs, largestMB, largestCPU)
	}
	return nil, refuse(ErrNoCapacity, CauseNoRoom, "no node has room for %d MiB more (%d full, %d above their memory high-water mark; %s)",
		creq.MemoryMB, full, hot, why)
}

// Headroom scores node n for req: the memory it could still commit after
// taking it. More is better: sandboxes spread by memory.
func Headroom(req Request, n *Node) int {
	return n.Rule.WithDefaults().HeadroomMB(req.capacity(), n.Load)
}

// Warm is the part of fits whose warm pools hold a prestarted sandbox
// for req (Pool), else the part holding a prepared one (Prepared), or
// fits itself when none does (or req names neither). It compacts fits in
// place when it keeps part of it.
func Warm(req Request, fits []*Node) []*Node {
	for _, key := range [...]string{req.Pool, req.Prepared} {
		if key == "" {
			continue
		}
		warm := 0
		for _, n := range fits {
			if n.Pooled[key] > 0 {
				warm++
			}
		}
		switch {
		case warm == 0:
			continue
		case warm == len(fits):
			return fits
		}
		return slices.DeleteFunc(fits, func(n *Node) bool { return n.Pooled[key] <= 0 })
	}
	return fits
}

// preferred is req.Prefer among fits, if there.
func preferred(req Request, fits []*Node) *Node {
	if req.Prefer == "" {
		return nil
	}
	for _, n := range fits {
		if n.ID == req.Prefer {
			return n
		}
	}
	return nil
}
