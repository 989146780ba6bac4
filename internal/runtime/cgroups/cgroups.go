// Package cgroups reads and writes the host's control groups for the
// runtime drivers, over either kind of hierarchy a Linux host boots with:
// cgroup v1 (one tree per controller, /sys/fs/cgroup/memory/...) and the
// unified cgroup v2 (one tree, /sys/fs/cgroup/..., where a service owns
// only the subtree delegated to it). Callers name a cgroup by a path such
// as "/aenv/<id>"; the Hierarchy places it where its kind wants it and
// says what to tell runsc (the OCI spec's cgroupsPath).
//
// Only runtime drivers (and the benchmark, which reads what they make)
// import it. Every path is under a root given to Open, so that tests run
// against fake trees of both kinds without root.
package cgroups

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// DefaultRoot is where Linux mounts the cgroup hierarchies.
const DefaultRoot = "/sys/fs/cgroup"

// Version is a kind of cgroup hierarchy.
type Version int

const (
	// V1 is one hierarchy per controller (memory, cpu, cpuacct, pids...).
	V1 Version = 1
	// V2 is the single unified hierarchy.
	V2 Version = 2
)

func (v Version) String() string { return "cgroup v" + strconv.Itoa(int(v)) }

// Limits are what Create sets on a new cgroup; a zero field sets nothing
// (the kernel's default: unlimited).
type Limits struct {
	// MemoryBytes is memory.max (v2) or memory.limit_in_bytes (v1).
	MemoryBytes int64
	// CPUQuota per CPUPeriod is the CPU time the cgroup may use: cpu.max
	// (v2) or cpu.cfs_quota_us and cpu.cfs_period_us (v1). Both or none.
	CPUQuota, CPUPeriod time.Duration
	// Pids bounds the cgroup's tasks (processes and threads): pids.max.
	Pids int64
}

// CPU weights on cgroup v2's cpu.weight scale. cgroup v1's cpu.shares
// is 1024 for each DefaultCPUWeight (see v1Shares).
const (
	// DefaultCPUWeight is every cgroup's weight unless set.
	DefaultCPUWeight = 100
	// MinCPUWeight is the lowest weight: against a sibling of the
	// default weight that wants the CPU too, a hundredth of it.
	MinCPUWeight = 1
	// maxCPUWeight is cgroup v2's highest.
	maxCPUWeight = 10000
)

// Pids is a cgroup's task count and its bound.
type Pids struct {
	// Current is how many tasks (threads) the cgroup and its children hold.
	Current int64
	// Max is their bound; 0 when unlimited.
	Max int64
}

// CPU is a cgroup's CPU time and its quota.
type CPU struct {
	// Usage is the CPU time the cgroup's tasks have used.
	Usage time.Duration
	// Quota per Period is the CPU time it may use; zero when unlimited.
	Quota, Period time.Duration
}

// Hierarchy is the host's cgroup tree as one service sees it. Names are
// absolute slash paths relative to the service's place in the tree
// ("/aenv/<id>"). A cgroup's life:
//
//	Create(name, limits) ─ tasks join (runsc, given Path(name)) ─ read
//	Memory / OOMKills / Pids / CPU while they run and after they leave ─
//	Remove(name) once empty
//
// runsc may also create the cgroup itself from Path(name) and the OCI
// spec's resources (as sandboxes do); it then removes it on delete, so
// anything to keep (an OOM count) must be read before.
type Hierarchy interface {
	// Version is the kind of hierarchy.
	Version() Version
	// Path is name as runsc and the OCI spec (linux.cgroupsPath) know it.
	Path(name string) string
	// Create makes cgroup name and its missing parents and sets lim on
	// it. An existing cgroup is kept and lim set again.
	Create(name string, lim Limits) error
	// Memory is the memory charged to name now that the kernel cannot
	// simply drop, in bytes: its usage less its inactive page cache (as
	// kubelet counts a working set). A restore reads its image through
	// the page cache, which is charged to the sandbox: a resumed 256 MiB
	// sandbox would otherwise count twice its size until reclaim.
	Memory(name string) (uint64, error)
	// OOMKills counts the tasks of name the kernel killed for want of
	// memory.
	OOMKills(name string) (uint64, error)
	// Pids is name's task count and bound.
	Pids(name string) (Pids, error)
	// CPU is name's CPU usage and quota.
	CPU(name string) (CPU, error)
	// SetCPUWeight sets the share of contended CPU name's tasks get
	// against its siblings', on cgroup v2's cpu.weight scale (clamped to
	// MinCPUWeight-10000; DefaultCPUWeight is what a cgroup starts with).
	SetCPUWeight(name string, weight uint64) error
	// Remove removes cgroup name, waiting a moment for the tasks of a
	// sandbox that just ended to leave it; a missing cgroup is no error.
	Remove(name string) error
}

// Options say where Open looks; the zero value is the host's.
type Options struct {
	// Root is where the hierarchies are mounted; empty means DefaultRoot.
	Root string
	// SelfCgroup is the calling process's cgroup file; empty means
	// /proc/self/cgroup. On v2 the service's subtree is its cgroup there.
	SelfCgroup string
	// Pid is the calling process; 0 means os.Getpid(). On v2 it is moved
	// into a leaf of its own subtree (see ServerLeaf).
	Pid int
}

// ServerLeaf is the child of its own cgroup that a service on cgroup v2
// moves itself into before it creates cgroups: v2 lets a cgroup either
// hold processes or give controllers to children, not both (the "no
// internal processes" rule), and its subtree is where sandboxes go.
const ServerLeaf = "aenv-server"

// Open detects the kind of hierarchy mounted at opts.Root: the unified
// hierarchy has a cgroup.controllers file at its root; a v1 host (or a
// hybrid one, whose v2 tree holds no controllers) has a tmpfs of
// per-controller mounts.
func Open(opts Options) (Hierarchy, error) {
	if opts.Root == "" {
		opts.Root = DefaultRoot
	}
	if opts.SelfCgroup == "" {
		opts.SelfCgroup = "/proc/self/cgroup"
	}
	if opts.Pid == 0 {
		opts.Pid = os.Getpid()
	}
	if _, err := os.Stat(filepath.Join(opts.Root, "cgroup.controllers")); err == nil {
		base, err := selfCgroupV2(opts.SelfCgroup)
		if err != nil {
			return nil, err
		}
		// A restarted Open in a process that already moved itself: its
		// subtree is the leaf's parent.
		if path.Base(base) == ServerLeaf {
			base = path.Dir(base)
		}
		return &v2{root: opts.Root, base: base, pid: opts.Pid}, nil
	}
	if _, err := os.Stat(filepath.Join(opts.Root, "memory")); err != nil {
		return nil, fmt.Errorf("detecting the cgroup hierarchy at %s: neither cgroup v2 (no cgroup.controllers) nor v1 (no memory controller): %w", opts.Root, err)
	}
	return &v1{root: opts.Root}, nil
}

// selfCgroupV2 is the process's cgroup in the unified hierarchy: the
// "0::<path>" line of /proc/<pid>/cgroup.
func selfCgroupV2(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading this process's cgroup: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			p = strings.TrimSpace(p)
			if !strings.HasPrefix(p, "/") {
				return "", fmt.Errorf("reading this process's cgroup: %q is not a path", p)
			}
			return path.Clean(p), nil
		}
	}
	return "", fmt.Errorf("reading this process's cgroup: no cgroup v2 entry in %s", file)
}

// clean makes name an absolute slash path without "..": names are ours,
// but a stray one must not reach outside the service's tree.
func clean(name string) string { return path.Clean("/" + name) }

func readUint(file string) (uint64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

func readInt(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// readKey is the value of key in a flat-keyed file ("key value" lines:
// memory.events, cpu.stat, memory.oom_control).
func readKey(file, key string) (uint64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s in %s", key, file)
}

// workingSet is usage less inactive (the inactive page cache), never
// below zero: the two are read one after the other, and the cache can
// grow in between.
func workingSet(usage, inactive uint64) uint64 {
	if inactive > usage {
		return 0
	}
	return usage - inactive
}

// readMax reads a limit that is a number or "max" (unlimited: 0).
func readMax(file string) (int64, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

func write(file, value string) error {
	// On a real tree the control files come with the cgroup (and cgroupfs
	// refuses to create others); on a fake tree the write makes them, so
	// tests read back exactly the files a kernel would have been given.
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// rmdir removes an empty cgroup directory, retrying while the kernel
// still counts tasks of a sandbox that just ended in it.
func rmdir(dir string) error {
	var err error
	for range 50 {
		if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}
