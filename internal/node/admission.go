package node

import (
	"errors"
	"fmt"
	goruntime "runtime"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// Admission errors. The cluster maps them to statuses: a sandbox that can
// never fit is the client's mistake (400); one that does not fit now is
// worth retrying (503 with Retry-After).
var (
	// ErrTooLarge: the sandbox asks for more than this node has at all.
	ErrTooLarge = errors.New("larger than the node")
	// ErrNoCapacity: the node cannot take the sandbox now.
	ErrNoCapacity = errors.New("node is full")
)

// Capacity is what a node may hand out, and how far it overcommits.
type Capacity struct {
	// MemoryMB and CPUCount are the node's size; a sandbox larger than
	// either is refused outright. Zero means the host's physical memory
	// and CPU count.
	MemoryMB, CPUCount int
	// MemoryOvercommit bounds the memory all sandboxes are configured
	// with together, as a multiple of MemoryMB (default 4): gVisor
	// sandboxes use what they touch, not what they may.
	MemoryOvercommit float64
	// MemoryHighWater refuses new sandboxes while the host's real memory
	// use is above this fraction (default 0.9).
	MemoryHighWater float64
	// DiskHighWater refuses new sandboxes while the disk their files go
	// to is fuller than this fraction (default 0.95).
	DiskHighWater float64
}

// withDefaults fills in zero fields from the host.
func (c Capacity) withDefaults() Capacity {
	if c.MemoryMB <= 0 {
		if total, _, err := hostMemory(); err == nil {
			c.MemoryMB = int(total >> 20)
		}
	}
	if c.CPUCount <= 0 {
		c.CPUCount = hostCPUs()
	}
	if c.MemoryOvercommit <= 0 {
		c.MemoryOvercommit = 4
	}
	if c.MemoryHighWater <= 0 || c.MemoryHighWater > 1 {
		c.MemoryHighWater = 0.9
	}
	if c.DiskHighWater <= 0 || c.DiskHighWater > 1 {
		c.DiskHighWater = 0.95
	}
	return c
}

// admit is the node's admission rule for one more sandbox of memMB and
// cpus, with committedMB configured on the node already (prestarted
// sandboxes included), usedFraction of the host's memory really in use
// and diskFraction of the sandboxes' disk (negative when unknown).
func (c Capacity) admit(memMB, cpus, committedMB int, usedFraction, diskFraction float64) error {
	switch {
	case memMB > c.MemoryMB:
		return fmt.Errorf("%w: memoryMB %d exceeds the node's %d MiB", ErrTooLarge, memMB, c.MemoryMB)
	case cpus > c.CPUCount:
		return fmt.Errorf("%w: cpuCount %d exceeds the node's %d CPUs", ErrTooLarge, cpus, c.CPUCount)
	}
	if limit := int(c.MemoryOvercommit * float64(c.MemoryMB)); committedMB+memMB > limit {
		return fmt.Errorf("%w: sandboxes hold %d MiB of the %d MiB the node may commit (%g x %d MiB); %d MiB more does not fit",
			ErrNoCapacity, committedMB, limit, c.MemoryOvercommit, c.MemoryMB, memMB)
	}
	if usedFraction > c.MemoryHighWater {
		return fmt.Errorf("%w: host memory is %.0f%% used, above the %.0f%% high-water mark",
			ErrNoCapacity, 100*usedFraction, 100*c.MemoryHighWater)
	}
	if diskFraction > c.DiskHighWater {
		return fmt.Errorf("%w: the host's sandbox disk is %.0f%% full, above the %.0f%% high-water mark",
			ErrNoCapacity, 100*diskFraction, 100*c.DiskHighWater)
	}
	return nil
}

// diskUsed is the fraction of the filesystem holding dir that is in use,
// or -1.
func diskUsed(dir string) float64 {
	total, free, err := diskSpace(dir)
	if err != nil || total == 0 {
		return -1
	}
	return float64(total-free) / float64(total)
}

// diskSpace is the size and the space available to unprivileged users of
// the filesystem holding dir, in bytes.
func diskSpace(dir string) (total, free uint64, err error) {
	if dir == "" {
		return 0, 0, errors.New("no directory")
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	return st.Blocks * uint64(st.Bsize), st.Bavail * uint64(st.Bsize), nil
}

// hostMemory reads the host's total and available memory in bytes.
func hostMemory() (total, available uint64, err error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, 0, err
	}
	mi, err := fs.Meminfo()
	if err != nil {
		return 0, 0, err
	}
	if mi.MemTotalBytes == nil || mi.MemAvailableBytes == nil {
		return 0, 0, errors.New("reading /proc/meminfo: no MemTotal or MemAvailable")
	}
	return *mi.MemTotalBytes, *mi.MemAvailableBytes, nil
}

// memoryUsed is the fraction of the host's memory in use, or -1.
func memoryUsed() float64 {
	total, avail, err := hostMemory()
	if err != nil || avail > total {
		return -1
	}
	return float64(total-avail) / float64(total)
}

func hostCPUs() int { return goruntime.NumCPU() }

// committedMB is the memory the node's sandboxes are configured with:
// running, prestarted and being created. The caller holds n.mu; poolMB is
// the prestarted sandboxes', read before.
func (n *Node) committedMBLocked(poolMB int) int {
	total := poolMB
	for _, sb := range n.sandboxes {
		total += sb.MemoryMB
	}
	for _, mb := range n.pending {
		total += mb
	}
	return total
}

// Stats is what a node has and uses now, for the cluster's registry.
type Stats struct {
	Capacity Capacity
	// CommittedMB is the memory its sandboxes (prestarted ones included)
	// are configured with; UsedMemoryMB the host's memory really in use,
	// of HostMemoryMB.
	CommittedMB, UsedMemoryMB, HostMemoryMB int
	// Sandboxes counts the running sandboxes handed out.
	Sandboxes int
	// DiskMB and DiskUsedMB are the size and use of the disk the
	// sandboxes' files go to.
	DiskMB, DiskUsedMB int
	// Runtime names the driver.
	Runtime string
}

// Stats reads the node's capacity and usage.
func (n *Node) Stats() Stats {
	poolMB := n.pool.memoryMB()
	st := Stats{Capacity: n.cfg.Capacity, Runtime: n.cfg.Runtime.Name()}
	if total, avail, err := hostMemory(); err == nil && avail <= total {
		st.UsedMemoryMB, st.HostMemoryMB = int((total-avail)>>20), int(total>>20)
	}
	if total, free, err := diskSpace(n.cfg.StateDir); err == nil && free <= total {
		st.DiskMB, st.DiskUsedMB = int(total>>20), int((total-free)>>20)
	}
	n.mu.Lock()
	st.CommittedMB = n.committedMBLocked(poolMB)
	st.Sandboxes = len(n.sandboxes)
	n.mu.Unlock()
	return st
}
