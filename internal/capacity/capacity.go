// Package capacity is the admission rule of a node: how much memory its
// sandboxes may be configured with together, when it refuses more, and
// whose snapshots its runtime restores. The node applies it to each
// create (internal/node), and the scheduler applies the same rule to the
// node's reports before choosing it (internal/placement), so that the two
// never disagree on a formula. It imports nothing of the module; anything
// may import it.
package capacity

import (
	"errors"
	"fmt"
)

// Defaults of a Rule's fractions, which the node's flags show as theirs.
const (
	// DefaultMemoryOvercommit: sandboxes may be configured with four times
	// the node's memory, since gVisor sandboxes use what they touch, not
	// what they may.
	DefaultMemoryOvercommit = 4
	// DefaultMemoryHighWater: no new sandbox while the host's real memory
	// use is above 90%.
	DefaultMemoryHighWater = 0.9
	// DefaultDiskHighWater: no new sandbox while the sandboxes' disk is
	// fuller than 95%.
	DefaultDiskHighWater = 0.95
)

// Admission errors. A sandbox that can never fit is the client's mistake
// (400); one that does not fit now is worth retrying (503 with
// Retry-After).
var (
	// ErrTooLarge: the sandbox asks for more than the node has at all.
	ErrTooLarge = errors.New("larger than the node")
	// ErrNoCapacity: the node cannot take the sandbox now.
	ErrNoCapacity = errors.New("node is full")
)

// Rule is what a node may hand out, and how far it overcommits.
type Rule struct {
	// MemoryMB and CPUCount are the node's size; a sandbox larger than
	// either is refused outright.
	MemoryMB, CPUCount int
	// MemoryOvercommit bounds the memory all sandboxes are configured
	// with together, as a multiple of MemoryMB.
	MemoryOvercommit float64
	// MemoryHighWater refuses new sandboxes while the host's real memory
	// use is above this fraction.
	MemoryHighWater float64
	// DiskHighWater refuses new sandboxes while the disk their files go
	// to is fuller than this fraction.
	DiskHighWater float64
}

// WithDefaults fills in the fractions left zero (or out of range) with the
// defaults. The size is the node's to fill: only it knows its host.
func (r Rule) WithDefaults() Rule {
	if r.MemoryOvercommit <= 0 {
		r.MemoryOvercommit = DefaultMemoryOvercommit
	}
	if r.MemoryHighWater <= 0 || r.MemoryHighWater > 1 {
		r.MemoryHighWater = DefaultMemoryHighWater
	}
	if r.DiskHighWater <= 0 || r.DiskHighWater > 1 {
		r.DiskHighWater = DefaultDiskHighWater
	}
	return r
}

// CommitLimitMB is the memory all sandboxes may be configured with
// together.
func (r Rule) CommitLimitMB() int { return int(r.MemoryOvercommit * float64(r.MemoryMB)) }

// Request is what one more sandbox asks of the node.
type Request struct {
	MemoryMB, CPUs int
}

// Load is what the node holds now.
type Load struct {
	// CommittedMB is the memory its sandboxes are configured with
	// (prestarted ones and those being created included).
	CommittedMB int
	// MemoryUsed is the fraction of the host's memory really in use, and
	// DiskUsed of the sandboxes' disk; negative when unknown.
	MemoryUsed, DiskUsed float64
}

// Verdict is what the rule says of one more sandbox.
type Verdict int

// Verdicts, in the order the rule checks them.
const (
	// Fits: the node takes it.
	Fits Verdict = iota
	// TooLarge: more memory or CPUs than the node has at all.
	TooLarge
	// OverCommitted: the memory configured would pass the overcommit.
	OverCommitted
	// MemoryHot: the host's real memory use is above the high-water mark.
	MemoryHot
	// DiskFull: the sandboxes' disk is above its high-water mark.
	DiskFull
)

// Check applies the rule to one more sandbox req on a node holding l.
func (r Rule) Check(req Request, l Load) Verdict {
	switch {
	case req.MemoryMB > r.MemoryMB || req.CPUs > r.CPUCount:
		return TooLarge
	case r.HeadroomMB(req, l) < 0:
		return OverCommitted
	case l.MemoryUsed > r.MemoryHighWater:
		return MemoryHot
	case l.DiskUsed > r.DiskHighWater:
		return DiskFull
	}
	return Fits
}

// HeadroomMB is the memory the node could still commit after taking req:
// negative when it cannot.
func (r Rule) HeadroomMB(req Request, l Load) int {
	return r.CommitLimitMB() - l.CommittedMB - req.MemoryMB
}

// Admit is Check as an error saying what ran out: ErrTooLarge or
// ErrNoCapacity, nil when the sandbox fits.
func (r Rule) Admit(req Request, l Load) error {
	switch r.Check(req, l) {
	case TooLarge:
		if req.MemoryMB > r.MemoryMB {
			return fmt.Errorf("%w: memoryMB %d exceeds the node's %d MiB", ErrTooLarge, req.MemoryMB, r.MemoryMB)
		}
		return fmt.Errorf("%w: cpuCount %d exceeds the node's %d CPUs", ErrTooLarge, req.CPUs, r.CPUCount)
	case OverCommitted:
		return fmt.Errorf("%w: sandboxes hold %d MiB of the %d MiB the node may commit (%g x %d MiB); %d MiB more does not fit",
			ErrNoCapacity, l.CommittedMB, r.CommitLimitMB(), r.MemoryOvercommit, r.MemoryMB, req.MemoryMB)
	case MemoryHot:
		return fmt.Errorf("%w: host memory is %.0f%% used, above the %.0f%% high-water mark",
			ErrNoCapacity, 100*l.MemoryUsed, 100*r.MemoryHighWater)
	case DiskFull:
		return fmt.Errorf("%w: the host's sandbox disk is %.0f%% full, above the %.0f%% high-water mark",
			ErrNoCapacity, 100*l.DiskUsed, 100*r.DiskHighWater)
	}
	return nil
}

// UnstampedVersion is what a runsc built without gVisor's version stamp
// reports (aenv's own builds did until they were stamped).
const UnstampedVersion = "VERSION_MISSING"

// Restorable says whether a node whose runtime is of version running can
// take a snapshot saved by version saved: the same version, or one the
// snapshot could not record (none, or an unstamped build's), which is
// taken to match, as it was before versions were recorded, so that
// snapshots and paused sandboxes outlive the upgrade that began to
// record them. The node applies it to a restore and placement to the
// nodes' reports, like the rest of this package.
func Restorable(saved, running string) bool {
	return saved == running || saved == "" || saved == UnstampedVersion
}
