package cgroups

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// v2 is a host with the unified hierarchy. A service owns the subtree of
// the cgroup it was started in (base: with systemd, its unit's cgroup,
// given to it by Delegate=yes), and a name is a path under base.
type v2 struct {
	root string
	// base is the service's cgroup, a path in the unified tree.
	base string
	// pid is this process, moved out of base before base gives its
	// controllers to children.
	pid int
}

var _ Hierarchy = (*v2)(nil)

// v2Controllers are the controllers the service's cgroups need: what
// Limits sets and the readers read (cpu.stat's usage is there without
// the cpu controller, but cpu.max is not).
var v2Controllers = []string{"cpu", "memory", "pids"}

func (h *v2) Version() Version { return V2 }

func (h *v2) Path(name string) string { return path.Join(h.base, clean(name)) }

func (h *v2) dir(name string) string {
	return filepath.Join(h.root, filepath.FromSlash(h.Path(name)))
}

// Create makes name under base. Each cgroup from base down to name's
// parent gives the controllers to its children first: a controller's
// files appear in a child only once its parent enables it in
// cgroup.subtree_control.
func (h *v2) Create(name string, lim Limits) error {
	name = clean(name)
	if name == "/" {
		return fmt.Errorf("creating cgroup %s: it is the service's own", name)
	}
	if err := h.delegate(); err != nil {
		return fmt.Errorf("creating cgroup %s: %w", name, err)
	}
	parts := strings.Split(strings.TrimPrefix(name, "/"), "/")
	cur := "/"
	for _, p := range parts {
		if cur != "/" {
			if err := h.enable(cur); err != nil {
				return fmt.Errorf("creating cgroup %s: %w", name, err)
			}
		}
		cur = path.Join(cur, p)
		if err := os.Mkdir(h.dir(cur), 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("creating cgroup %s: %w", name, err)
		}
	}
	dir := h.dir(name)
	var set [][2]string
	if lim.MemoryBytes > 0 {
		set = append(set, [2]string{"memory.max", strconv.FormatInt(lim.MemoryBytes, 10)})
	}
	if lim.CPUQuota > 0 && lim.CPUPeriod > 0 {
		set = append(set, [2]string{"cpu.max", fmt.Sprintf("%d %d", lim.CPUQuota.Microseconds(), lim.CPUPeriod.Microseconds())})
	}
	if lim.Pids > 0 {
		set = append(set, [2]string{"pids.max", strconv.FormatInt(lim.Pids, 10)})
	}
	for _, s := range set {
		if err := write(filepath.Join(dir, s[0]), s[1]); err != nil {
			return fmt.Errorf("limiting cgroup %s: %w", name, err)
		}
	}
	return nil
}

// delegate makes base able to give controllers to children: a cgroup
// other than the root one cannot while it holds processes, so this
// process moves into a leaf of its own, ServerLeaf. Other processes in
// base (a shell's session scope, say) are not ours to move: that is an
// error saying how to run the service.
func (h *v2) delegate() error {
	if h.base == "/" || h.enabled(h.base) {
		// The root cgroup is exempt from the rule.
		return h.enable("/")
	}
	procs, err := os.ReadFile(filepath.Join(h.root, filepath.FromSlash(h.base), "cgroup.procs"))
	if err != nil {
		return fmt.Errorf("reading the processes of %s: %w", h.base, err)
	}
	var others []string
	self := strconv.Itoa(h.pid)
	for _, p := range strings.Fields(string(procs)) {
		if p == self {
			if err := h.moveSelf(); err != nil {
				return err
			}
		} else {
			others = append(others, p)
		}
	}
	if len(others) > 0 {
		return fmt.Errorf("cgroup v2: %s holds processes other than this one (%s), so it cannot give controllers to sandboxes; run aenv in a cgroup of its own (a systemd unit with Delegate=yes)", h.base, strings.Join(others, " "))
	}
	return h.enable("/")
}

// moveSelf moves this process from base into base/ServerLeaf.
func (h *v2) moveSelf() error {
	leaf := filepath.Join(h.root, filepath.FromSlash(h.base), ServerLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !os.IsExist(err) {
		return fmt.Errorf("creating %s/%s: %w", h.base, ServerLeaf, err)
	}
	// Writing a pid to cgroup.procs moves the whole process, every thread.
	if err := write(filepath.Join(leaf, "cgroup.procs"), strconv.Itoa(h.pid)); err != nil {
		return fmt.Errorf("moving this process into %s/%s: %w", h.base, ServerLeaf, err)
	}
	return nil
}

// enabled reports whether cgroup p (a path in the unified tree) gives
// all of v2Controllers to its children.
func (h *v2) enabled(p string) bool {
	b, err := os.ReadFile(filepath.Join(h.root, filepath.FromSlash(p), "cgroup.subtree_control"))
	if err != nil {
		return false
	}
	have := strings.Fields(string(b))
	for _, c := range v2Controllers {
		if !slices.Contains(have, c) {
			return false
		}
	}
	return true
}

// enable makes cgroup name (under base) give v2Controllers to its
// children, failing plainly when one was not delegated to it.
func (h *v2) enable(name string) error {
	p := h.Path(name)
	if h.enabled(p) {
		return nil
	}
	dir := h.dir(name)
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return fmt.Errorf("reading the controllers of %s: %w", p, err)
	}
	have := strings.Fields(string(b))
	var add []string
	for _, c := range v2Controllers {
		if !slices.Contains(have, c) {
			return fmt.Errorf("cgroup v2: controller %s is not available in %s (its parent does not delegate it)", c, p)
		}
		add = append(add, "+"+c)
	}
	// The kernel adds to what is enabled; a fake tree keeps what is
	// written, so write the whole set.
	if err := write(filepath.Join(dir, "cgroup.subtree_control"), strings.Join(add, " ")); err != nil {
		return fmt.Errorf("enabling %s in %s: %w", strings.Join(v2Controllers, ", "), p, err)
	}
	return nil
}

func (h *v2) Memory(name string) (uint64, error) {
	n, err := readUint(filepath.Join(h.dir(name), "memory.current"))
	if err != nil {
		return 0, fmt.Errorf("reading the memory of cgroup %s: %w", name, err)
	}
	inactive, err := readKey(filepath.Join(h.dir(name), "memory.stat"), "inactive_file")
	if err != nil {
		return 0, fmt.Errorf("reading the memory of cgroup %s: %w", name, err)
	}
	return workingSet(n, inactive), nil
}

func (h *v2) OOMKills(name string) (uint64, error) {
	n, err := readKey(filepath.Join(h.dir(name), "memory.events"), "oom_kill")
	if err != nil {
		return 0, fmt.Errorf("reading the OOM kills of cgroup %s: %w", name, err)
	}
	return n, nil
}

func (h *v2) Pids(name string) (Pids, error) {
	dir := h.dir(name)
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

func (h *v2) CPU(name string) (CPU, error) {
	dir := h.dir(name)
	us, err := readKey(filepath.Join(dir, "cpu.stat"), "usage_usec")
	if err != nil {
		return CPU{}, fmt.Errorf("reading the CPU usage of cgroup %s: %w", name, err)
	}
	out := CPU{Usage: time.Duration(us) * time.Microsecond}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
	if err != nil {
		return CPU{}, fmt.Errorf("reading the CPU quota of cgroup %s: %w", name, err)
	}
	// "max 100000" or "<quota> <period>", in microseconds.
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return CPU{}, fmt.Errorf("reading the CPU quota of cgroup %s: cpu.max is %q", name, b)
	}
	if f[0] != "max" {
		q, qerr := strconv.ParseInt(f[0], 10, 64)
		p, perr := strconv.ParseInt(f[1], 10, 64)
		if qerr != nil || perr != nil {
			return CPU{}, fmt.Errorf("reading the CPU quota of cgroup %s: cpu.max is %q", name, b)
		}
		out.Quota, out.Period = time.Duration(q)*time.Microsecond, time.Duration(p)*time.Microsecond
	}
	return out, nil
}

func (h *v2) SetCPUWeight(name string, weight uint64) error {
	weight = min(max(weight, MinCPUWeight), maxCPUWeight)
	if err := write(filepath.Join(h.dir(name), "cpu.weight"), strconv.FormatUint(weight, 10)); err != nil {
		return fmt.Errorf("setting the CPU weight of cgroup %s: %w", name, err)
	}
	return nil
}

func (h *v2) Remove(name string) error {
	if clean(name) == "/" {
		return fmt.Errorf("removing cgroup %s: it is the service's own", name)
	}
	if err := rmdir(h.dir(name)); err != nil {
		return fmt.Errorf("removing cgroup %s: %w", name, err)
	}
	return nil
}
