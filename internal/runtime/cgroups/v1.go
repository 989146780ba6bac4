package cgroups

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// v1 is a host with one hierarchy per controller. A name is the same path
// in each of them, which is also what runsc is told.
type v1 struct {
	root string
}

var _ Hierarchy = (*v1)(nil)

// v1Controllers are the hierarchies a cgroup is made in: the ones this
// package limits or reads. runsc makes the rest (devices, freezer...)
// itself for the cgroups it runs in.
var v1Controllers = []string{"memory", "cpu", "cpuacct", "pids"}

func (h *v1) Version() Version { return V1 }

func (h *v1) Path(name string) string { return clean(name) }

func (h *v1) dir(controller, name string) string {
	return filepath.Join(h.root, controller, clean(name))
}

func (h *v1) Create(name string, lim Limits) error {
	for _, c := range v1Controllers {
		if err := os.MkdirAll(h.dir(c, name), 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", name, err)
		}
	}
	var set []struct{ file, value string }
	add := func(file string, v int64) {
		set = append(set, struct{ file, value string }{file, strconv.FormatInt(v, 10)})
	}
	if lim.MemoryBytes > 0 {
		add(filepath.Join(h.dir("memory", name), "memory.limit_in_bytes"), lim.MemoryBytes)
	}
	if lim.CPUQuota > 0 && lim.CPUPeriod > 0 {
		add(filepath.Join(h.dir("cpu", name), "cpu.cfs_period_us"), lim.CPUPeriod.Microseconds())
		add(filepath.Join(h.dir("cpu", name), "cpu.cfs_quota_us"), lim.CPUQuota.Microseconds())
	}
	if lim.Pids > 0 {
		add(filepath.Join(h.dir("pids", name), "pids.max"), lim.Pids)
	}
	for _, s := range set {
		if err := write(s.file, s.value); err != nil {
			return fmt.Errorf("limiting cgroup %s: %w", name, err)
		}
	}
	return nil
}

func (h *v1) Memory(name string) (uint64, error) {
	dir := h.dir("memory", name)
	n, err := readUint(filepath.Join(dir, "memory.usage_in_bytes"))
	if err != nil {
		return 0, fmt.Errorf("reading the memory of cgroup %s: %w", name, err)
	}
	inactive, err := readKey(filepath.Join(dir, "memory.stat"), "total_inactive_file")
	if err != nil {
		return 0, fmt.Errorf("reading the memory of cgroup %s: %w", name, err)
	}
	return workingSet(n, inactive), nil
}

func (h *v1) OOMKills(name string) (uint64, error) {
	n, err := readKey(filepath.Join(h.dir("memory", name), "memory.oom_control"), "oom_kill")
	if err != nil {
		return 0, fmt.Errorf("reading the OOM kills of cgroup %s: %w", name, err)
	}
	return n, nil
}

func (h *v1) Pids(name string) (Pids, error) {
	dir := h.dir("pids", name)
	cur, err := readUint(filepath.Join(dir, "pids.current"))
	if err != nil {
		return Pids{}, fmt.Errorf("reading the pids of cgroup %s: %w", name, err)
	}
	max, err := readMax(filepath.Join(dir, "pids.max"))
	if err != nil {
		return Pids{}, fmt.Errorf("reading the pids limit of cgroup %s: %w", name, err)
	}
	return Pids{Current: int64(cur), Max: max}, nil
}

func (h *v1) CPU(name string) (CPU, error) {
	ns, err := readUint(filepath.Join(h.dir("cpuacct", name), "cpuacct.usage"))
	if err != nil {
		return CPU{}, fmt.Errorf("reading the CPU usage of cgroup %s: %w", name, err)
	}
	out := CPU{Usage: time.Duration(ns)}
	dir := h.dir("cpu", name)
	quota, err := readInt(filepath.Join(dir, "cpu.cfs_quota_us"))
	if err != nil {
		return CPU{}, fmt.Errorf("reading the CPU quota of cgroup %s: %w", name, err)
	}
	if quota > 0 { // -1: unlimited
		period, err := readUint(filepath.Join(dir, "cpu.cfs_period_us"))
		if err != nil {
			return CPU{}, fmt.Errorf("reading the CPU period of cgroup %s: %w", name, err)
		}
		out.Quota, out.Period = time.Duration(quota)*time.Microsecond, time.Duration(period)*time.Microsecond
	}
	return out, nil
}

func (h *v1) SetCPUWeight(name string, weight uint64) error {
	if err := write(filepath.Join(h.dir("cpu", name), "cpu.shares"), strconv.FormatUint(v1Shares(weight), 10)); err != nil {
		return fmt.Errorf("setting the CPU weight of cgroup %s: %w", name, err)
	}
	return nil
}

// v1Shares is cpu.shares for a weight on v2's scale: 1024 per
// DefaultCPUWeight, within the kernel's 2-262144.
func v1Shares(weight uint64) uint64 {
	return min(max(weight*1024/DefaultCPUWeight, 2), 262144)
}

func (h *v1) Remove(name string) error {
	var errs []error
	for _, c := range v1Controllers {
		if err := rmdir(h.dir(c, name)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("removing cgroup %s: %w", name, err)
	}
	return nil
}
