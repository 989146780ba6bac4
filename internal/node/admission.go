package node

import (
	"errors"
	goruntime "runtime"
	"sync"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/capacity"
)

// Admission errors, the rule's own (see capacity): the node API maps them
// to statuses, a sandbox that can never fit being the client's mistake
// (400) and one that does not fit now worth retrying (503 with
// Retry-After).
var (
	// ErrTooLarge: the sandbox asks for more than this node has at all.
	ErrTooLarge = capacity.ErrTooLarge
	// ErrNoCapacity: the node cannot take the sandbox now.
	ErrNoCapacity = capacity.ErrNoCapacity
)

// Capacity is what a node may hand out, and how far it overcommits: the
// admission rule, which the node reports so that placement applies the
// same one. Zero MemoryMB and CPUCount mean the host's physical memory and
// CPU count.
type Capacity = capacity.Rule

// withHostDefaults fills in zero fields: the size from the host, the
// fractions from the rule's defaults.
func withHostDefaults(c Capacity) Capacity {
	if c.MemoryMB <= 0 {
		if total, _, err := hostMemory(); err == nil {
			c.MemoryMB = int(total >> 20)
		}
	}
	if c.CPUCount <= 0 {
		c.CPUCount = hostCPUs()
	}
	return c.WithDefaults()
}

// admit is the node's admission rule for one more sandbox of memMB and
// cpus, with committedMB configured on the node already (prestarted
// sandboxes included), usedFraction of the host's memory really in use
// and diskFraction of the sandboxes' disk (negative when unknown).
func admit(c Capacity, memMB, cpus, committedMB int, usedFraction, diskFraction float64) error {
	return c.Admit(capacity.Request{MemoryMB: memMB, CPUs: cpus},
		capacity.Load{CommittedMB: committedMB, MemoryUsed: usedFraction, DiskUsed: diskFraction})
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

// hostLoad is what the node reads of its host's load: admission its
// memory, the warm pool's refill its memory and CPUs. Tests replace it.
type hostLoad interface {
	// memory is the host's memory in bytes and the fraction of it in use
	// (-1: unknown).
	memory() (totalBytes uint64, used float64)
	// cpuBusy is the fraction of the host's CPU time spent busy since the
	// previous call (-1: unknown, as on the first call).
	cpuBusy() float64
}

// procLoad reads the host's load from /proc.
type procLoad struct {
	mu              sync.Mutex
	busy, total     float64 // CPU seconds, as of the previous call
	haveCPUBaseline bool
}

func (*procLoad) memory() (uint64, float64) {
	total, avail, err := hostMemory()
	if err != nil || avail > total || total == 0 {
		return total, -1
	}
	return total, float64(total-avail) / float64(total)
}

func (l *procLoad) cpuBusy() float64 {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return -1
	}
	st, err := fs.Stat()
	if err != nil {
		return -1
	}
	c := st.CPUTotal
	idle := c.Idle + c.Iowait
	total := idle + c.User + c.Nice + c.System + c.IRQ + c.SoftIRQ + c.Steal
	busy := total - idle
	l.mu.Lock()
	defer l.mu.Unlock()
	prevBusy, prevTotal, had := l.busy, l.total, l.haveCPUBaseline
	l.busy, l.total, l.haveCPUBaseline = busy, total, true
	if !had || total <= prevTotal {
		return -1
	}
	return (busy - prevBusy) / (total - prevTotal)
}

// memoryUsed is the fraction of the host's memory in use, or -1.
func (n *Node) memoryUsed() float64 {
	_, used := n.load.memory()
	return used
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
	for _, p := range n.pending {
		total += p.mb
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
	// CommittedCPUs are the vCPUs its sandboxes are configured with,
	// prestarted ones included, as CommittedMB counts their memory.
	CommittedCPUs int
	// Sandboxes counts the running sandboxes handed out, Pooled the
	// warm pool's prestarted ones (see WarmPool).
	Sandboxes, Pooled int
	// DiskMB and DiskUsedMB are the size and use of the disk the
	// sandboxes' files go to.
	DiskMB, DiskUsedMB int
	// Runtime names the driver.
	Runtime string
}

// Stats reads the node's capacity and usage.
func (n *Node) Stats() Stats {
	poolMB := n.pool.memoryMB()
	// Prepared sandboxes run nothing: they are neither sandboxes a create
	// takes nor CPUs in use.
	pool := n.pool.listOf(false)
	st := Stats{Capacity: n.cfg.Capacity, Runtime: n.cfg.Runtime.Name(), Pooled: len(pool)}
	for _, sb := range pool {
		st.CommittedCPUs += sb.CPUCount
	}
	if total, used := n.load.memory(); used >= 0 {
		st.UsedMemoryMB, st.HostMemoryMB = int(used*float64(total))>>20, int(total>>20)
	}
	if total, free, err := diskSpace(n.cfg.StateDir); err == nil && free <= total {
		st.DiskMB, st.DiskUsedMB = int(total>>20), int((total-free)>>20)
	}
	n.mu.Lock()
	st.CommittedMB = n.committedMBLocked(poolMB)
	st.Sandboxes = len(n.sandboxes)
	for _, sb := range n.sandboxes {
		st.CommittedCPUs += sb.CPUCount
	}
	n.mu.Unlock()
	return st
}
