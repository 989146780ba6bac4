package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// Defaults for IdleOptions.
const (
	DefaultIdleCount = 100
	// DefaultIdleCommand is the idle workload: a Python interpreter that
	// sleeps, started in the background so that the command returns.
	DefaultIdleCommand = "nohup setsid python3 -c 'import time; time.sleep(10**6)' </dev/null >/dev/null 2>&1 &"
	// DefaultIdleSettle is how long the sandboxes are left alone before
	// they are read: the Go runtimes of the sentry, the gofer and envd
	// return freed heap to the host over minutes, not at once.
	DefaultIdleSettle = 30 * time.Second
)

// IdleOptions configure the idle-density measurement.
type IdleOptions struct {
	// Count is how many sandboxes are held idle together (default 100).
	Count int
	// Concurrency is how many are created at once (default 4).
	Concurrency int
	// Template is what they are created from (default base).
	Template string
	// Command is started in each (default DefaultIdleCommand).
	Command string
	// CgroupParent is the server's --netns-tag: sandbox id's memory
	// cgroup is <cgroup root>/<CgroupParent>/<id>.
	CgroupParent string
	// Settle is the pause between the last start and the readings
	// (default DefaultIdleSettle).
	Settle time.Duration
	// Progress receives a progress line; nil is silent.
	Progress io.Writer

	// meminfo, cgroupRoot, cpuRoot and procRoot are where the readings
	// come from; tests move them.
	meminfo, cgroupRoot, cpuRoot, procRoot string
}

func (o IdleOptions) withDefaults() IdleOptions {
	if o.Count <= 0 {
		o.Count = DefaultIdleCount
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 4
	}
	if o.Template == "" {
		o.Template = DefaultTemplate
	}
	if o.Command == "" {
		o.Command = DefaultIdleCommand
	}
	if o.CgroupParent == "" {
		o.CgroupParent = DefaultCgroupParent
	}
	if o.Settle == 0 {
		o.Settle = DefaultIdleSettle
	}
	if o.meminfo == "" {
		o.meminfo = meminfoPath
	}
	if o.cgroupRoot == "" {
		o.cgroupRoot = cgroupRoot
	}
	if o.cpuRoot == "" {
		o.cpuRoot = cpuRoot
	}
	if o.procRoot == "" {
		o.procRoot = procRoot
	}
	return o
}

// IdleResult is what Count idle sandboxes cost the host.
type IdleResult struct {
	Sandboxes int
	// Settle is how long they were left alone before the readings.
	Settle time.Duration
	// Before and After are /proc/meminfo (bytes by key) before the first
	// create and after the settle.
	Before, After map[string]int64
	// Each is every sandbox's breakdown.
	Each []IdleSandbox
	// MemoryMB is the memory the sandboxes were configured with, and
	// Nodes the cluster's nodes as listed while they were held (nil when
	// the API cannot list them): what EstimateHeld needs.
	MemoryMB int
	Nodes    []client.Node
	// OthersBefore and OthersAfter are the memory cgroup usage of the
	// server's sandboxes other than these (its warm pool's, mostly), when
	// Before and After were read: the pool grows from what the creates
	// teach it, which is not what an idle sandbox costs.
	OthersBefore, OthersAfter int64
	// BusyBefore and BusyAfter are the host's busy CPUs (cores, averaged
	// over a window of up to idleCPUWindow) before the first create and
	// at the end of the settle.
	BusyBefore, BusyAfter float64
	// OwnCPU is the median, over the sandboxes whose cpuacct cgroup
	// could be read (OwnCPURead of them), of the CPU-seconds per second
	// each used in its own cgroup over BusyAfter's window: the sandbox's
	// processes alone, which the host's figure mixes with the server's
	// and the warm pool's (a pool taught by the creates boots its
	// sandboxes during the settle).
	OwnCPU     float64
	OwnCPURead int
}

// CPUPerSandbox is the host CPU an idle sandbox keeps busy, in
// CPU-seconds per second: the busy cores it added, the server's own
// share of its upkeep included.
func (r *IdleResult) CPUPerSandbox() float64 {
	if r.Sandboxes == 0 {
		return 0
	}
	return max(0, r.BusyAfter-r.BusyBefore) / float64(r.Sandboxes)
}

// Held is how many idle sandboxes like these the cluster would hold
// before admission refused one.
func (r *IdleResult) Held() HeldEstimate {
	return EstimateHeld(r.Nodes, r.Sandboxes, r.MemoryMB, r.AvailableDropPerSandbox())
}

// IdleSandbox is one sandbox's memory, from the host and from inside.
type IdleSandbox struct {
	ID string
	// Cgroup is its memory cgroup: usage_in_bytes as "usage",
	// kmem.usage_in_bytes as "kmem", and memory.stat's own keys.
	Cgroup map[string]int64
	// Host are its host processes (the cgroup's).
	Host []HostProcess
	// Guest are the processes inside, as the guest kernel counts them.
	Guest []GuestProcess
}

// HostProcess is one host process of a sandbox.
type HostProcess struct {
	PID int
	// Role is sentry (runsc-sandbox), gofer (runsc-gofer) or stub (the
	// systrap processes that hold guest address spaces).
	Role string
	// Rollup is /proc/PID/smaps_rollup (Rss, Pss, Pss_Anon, Pss_Shmem,
	// Private_Dirty, ...) plus VmPTE from /proc/PID/status, in bytes.
	Rollup map[string]int64
}

// GuestProcess is one process inside a sandbox, from its /proc/PID/status.
type GuestProcess struct {
	PID  int
	Name string
	// RSSBytes is VmRSS: with the binary's file pages, which the host
	// shares between sandboxes.
	RSSBytes int64
}

// Guest-side reading: one line per process, "pid comm VmRSS-kB".
const guestScript = `for p in /proc/[0-9]*; do echo "${p#/proc/} $(cat $p/comm) $(awk '/^VmRSS:/{print $2}' $p/status)"; done 2>/dev/null`

// MeasureIdle creates opts.Count sandboxes, starts opts.Command in each,
// lets them settle, reads the host's memory, every sandbox's cgroup and
// host processes and its guest processes, and kills them all.
func MeasureIdle(ctx context.Context, api API, opts IdleOptions) (res *IdleResult, err error) {
	opts = opts.withDefaults()
	res = &IdleResult{Sandboxes: opts.Count, Settle: opts.Settle}
	window := cpuWindow(opts.Settle)
	res.BusyBefore = busyCores(ctx, window)
	if res.Before, err = readMeminfo(opts.meminfo); err != nil {
		return nil, err
	}
	res.OthersBefore = othersUsage(opts, nil)
	var mu sync.Mutex
	var sandboxes []*client.Sandbox
	defer func() {
		kills := make([]cleanup, len(sandboxes))
		for i, sb := range sandboxes {
			kills[i] = func(ctx context.Context) error { return api.Kill(ctx, sb.SandboxID) }
		}
		if kerr := runCleanups(ctx, kills...); kerr != nil {
			err = errors.Join(err, fmt.Errorf("idle: killing: %w", kerr))
		}
	}()
	p := newProgress(opts.Progress)
	p.start("idle: creating", opts.Count)
	errs := make(chan error, opts.Count)
	// The first must outlive the creation of the others, the settling and
	// the readings: a thousand take minutes to start.
	timeout := sandboxTimeout + opts.Count + int(opts.Settle.Seconds())
	runN(ctx, opts.Count, opts.Concurrency, func() {
		sb, err := api.Create(ctx, client.CreateOptions{TemplateID: opts.Template, Timeout: timeout})
		if err != nil {
			errs <- err
			return
		}
		mu.Lock()
		sandboxes = append(sandboxes, sb)
		p.update(len(sandboxes))
		mu.Unlock()
		ro := client.RunOptions{AccessToken: sb.EnvdAccessToken}
		if code, err := api.Run(ctx, sb.SandboxID, opts.Command, ro); err != nil || code != 0 {
			errs <- fmt.Errorf("starting the idle command in %s: %w (exit %d)", sb.SandboxID, err, code)
		}
	})
	p.end()
	close(errs)
	failed := []error{ctx.Err()}
	for err := range errs {
		failed = append(failed, err)
	}
	if err := errors.Join(failed...); err != nil {
		return res, fmt.Errorf("idle: creating: %w", err)
	}
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(opts.Settle - window):
	}
	ids := make([]string, len(sandboxes))
	for i, sb := range sandboxes {
		ids[i] = sb.SandboxID
	}
	cpuDir := filepath.Join(opts.cpuRoot, opts.CgroupParent)
	before, start := readCPUUsage(cpuDir, ids), time.Now()
	res.BusyAfter = busyCores(ctx, window)
	res.OwnCPU, res.OwnCPURead = ownCPU(before, readCPUUsage(cpuDir, ids), time.Since(start))
	if res.After, err = readMeminfo(opts.meminfo); err != nil {
		return res, err
	}
	mine := make(map[string]bool, len(sandboxes))
	for _, sb := range sandboxes {
		mine[sb.SandboxID] = true
	}
	res.OthersAfter = othersUsage(opts, mine)
	if len(sandboxes) > 0 {
		_, res.MemoryMB = sandboxSize(ctx, api, sandboxes[0])
	}
	if nl, ok := api.(nodeLister); ok {
		if res.Nodes, err = nl.Nodes(ctx); err != nil {
			return res, fmt.Errorf("idle: %w", err)
		}
	}
	p.start("idle: reading", len(sandboxes))
	defer p.end()
	for i, sb := range sandboxes {
		s, err := readIdleSandbox(ctx, api, opts, sb)
		if err != nil {
			return res, fmt.Errorf("idle: %w", err)
		}
		res.Each = append(res.Each, s)
		p.update(i + 1)
	}
	return res, nil
}

// readCPUUsage reads the CPU time, in nanoseconds, each of ids has used
// in all, from its cgroup's cpuacct.usage under dir; one that cannot be
// read is left out.
func readCPUUsage(dir string, ids []string) map[string]int64 {
	out := make(map[string]int64, len(ids))
	for _, id := range ids {
		if v, err := readNumber(filepath.Join(dir, id, "cpuacct.usage")); err == nil {
			out[id] = v
		}
	}
	return out
}

// ownCPU is the median of the CPU-seconds per second that the cgroups
// read both before and after used over d, and how many there were.
func ownCPU(before, after map[string]int64, d time.Duration) (float64, int) {
	if d <= 0 {
		return 0, 0
	}
	var used []int64
	for id, b := range before {
		if a, ok := after[id]; ok && a >= b {
			used = append(used, a-b)
		}
	}
	if len(used) == 0 {
		return 0, 0
	}
	return float64(medianOf(used)) / float64(d), len(used)
}

// othersUsage sums the memory cgroup usage of the sandboxes under
// opts.CgroupParent that are not mine; a cgroup that cannot be read (one
// ending as it is listed) counts nothing.
func othersUsage(opts IdleOptions, mine map[string]bool) int64 {
	entries, err := os.ReadDir(filepath.Join(opts.cgroupRoot, opts.CgroupParent))
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		if !e.IsDir() || mine[e.Name()] {
			continue
		}
		if u, err := cgroupMemory(opts.cgroupRoot, opts.CgroupParent, e.Name()); err == nil {
			n += u
		}
	}
	return n
}

// readIdleSandbox reads sb's cgroup, host processes and guest processes.
func readIdleSandbox(ctx context.Context, api API, opts IdleOptions, sb *client.Sandbox) (IdleSandbox, error) {
	s := IdleSandbox{ID: sb.SandboxID}
	dir := filepath.Join(opts.cgroupRoot, opts.CgroupParent, sb.SandboxID)
	var err error
	if s.Cgroup, err = readCgroupStat(dir); err != nil {
		return s, fmt.Errorf("reading cgroup of %s: %w", sb.SandboxID, err)
	}
	pids, err := readPids(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return s, fmt.Errorf("reading cgroup of %s: %w", sb.SandboxID, err)
	}
	for _, pid := range pids {
		hp, err := readHostProcess(opts.procRoot, pid)
		if err != nil {
			// A process may end between the listing and the read.
			continue
		}
		s.Host = append(s.Host, hp)
	}
	var out bytes.Buffer
	code, err := api.Run(ctx, sb.SandboxID, guestScript, client.RunOptions{AccessToken: sb.EnvdAccessToken, Stdout: &out})
	if err != nil || code != 0 {
		return s, fmt.Errorf("reading the processes in %s: %w (exit %d)", sb.SandboxID, err, code)
	}
	s.Guest = parseGuestProcesses(out.String())
	return s, nil
}

// readMeminfo reads a meminfo file into bytes by key.
func readMeminfo(path string) (map[string]int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading host memory: %w", err)
	}
	defer f.Close()
	m, err := parseMeminfo(f)
	if err != nil {
		return nil, fmt.Errorf("reading host memory: %w", err)
	}
	return m, nil
}

// readCgroupStat reads a cgroup v1 memory directory: memory.stat's keys,
// "usage" and "kmem".
func readCgroupStat(dir string) (map[string]int64, error) {
	out := map[string]int64{}
	b, err := os.ReadFile(filepath.Join(dir, "memory.stat"))
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			out[k] = n
		}
	}
	for key, file := range map[string]string{"usage": "memory.usage_in_bytes", "kmem": "memory.kmem.usage_in_bytes"} {
		n, err := readNumber(filepath.Join(dir, file))
		if err != nil {
			return nil, err
		}
		out[key] = n
	}
	return out, nil
}

// readPids reads a cgroup.procs file.
func readPids(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []int
	for f := range strings.FieldsSeq(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

// readHostProcess reads pid's role, smaps_rollup and VmPTE.
func readHostProcess(proc string, pid int) (HostProcess, error) {
	dir := filepath.Join(proc, strconv.Itoa(pid))
	hp := HostProcess{PID: pid, Role: "stub"}
	cmd, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return hp, err
	}
	if args := splitCmdline(cmd); len(args) > 0 {
		switch {
		case strings.Contains(args[0], "gofer"):
			hp.Role = "gofer"
		case strings.Contains(args[0], "sandbox"):
			hp.Role = "sentry"
		}
	}
	f, err := os.Open(filepath.Join(dir, "smaps_rollup"))
	if err != nil {
		return hp, err
	}
	defer f.Close()
	if hp.Rollup, err = parseKB(f); err != nil {
		return hp, err
	}
	st, err := os.Open(filepath.Join(dir, "status"))
	if err != nil {
		return hp, err
	}
	defer st.Close()
	status, err := parseKB(st)
	if err != nil {
		return hp, err
	}
	hp.Rollup["VmPTE"] = status["VmPTE"]
	return hp, nil
}

// parseKB reads "Key: N kB" lines (smaps_rollup, status) into bytes,
// skipping lines that are not.
func parseKB(r io.Reader) (map[string]int64, error) {
	out := map[string]int64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		k, rest, ok := strings.Cut(sc.Text(), ":")
		f := strings.Fields(rest)
		if !ok || len(f) != 2 || f[1] != "kB" {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			out[k] = n << 10
		}
	}
	return out, sc.Err()
}

// parseGuestProcesses reads guestScript's "pid comm kB" lines; a process
// that ended half-way (no VmRSS) is left out.
func parseGuestProcesses(s string) []GuestProcess {
	var out []GuestProcess
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		kb, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, GuestProcess{PID: pid, Name: f[1], RSSBytes: kb << 10})
	}
	return out
}

// AvailableDropPerSandbox is how much MemAvailable fell per sandbox: what
// one idle sandbox costs the host, all told (the server's own share and
// kernel memory outside the sandbox's cgroup included), less what the
// server's other sandboxes (its warm pool) grew by meanwhile.
func (r *IdleResult) AvailableDropPerSandbox() int64 {
	if r.Sandboxes == 0 || r.Before == nil || r.After == nil {
		return 0
	}
	drop := r.Before["MemAvailable"] - r.After["MemAvailable"] - (r.OthersAfter - r.OthersBefore)
	return drop / int64(r.Sandboxes)
}

// AvailableDropBelowCgroup reports whether the MemAvailable drop per
// sandbox is below the median of the sandboxes' own cgroup usage, and that
// median. A sandbox cannot cost the host less than its cgroup holds, so
// such a drop means memory was freed elsewhere during the run (the last
// server's sandboxes ending, say), and the figure, and the estimate of
// sandboxes held that is made from it, read low.
func (r *IdleResult) AvailableDropBelowCgroup() (cgroup int64, low bool) {
	if len(r.Each) == 0 {
		return 0, false
	}
	cgroup = idleMedian(r.Each, cgroupKey("usage"))
	return cgroup, r.AvailableDropPerSandbox() < cgroup
}

// idleRow is one line of the breakdown: a name and how to read it off one
// sandbox.
type idleRow struct {
	name string
	of   func(IdleSandbox) int64
}

// roleSum sums key over s's host processes of role ("" for all).
func roleSum(s IdleSandbox, role, key string) int64 {
	var n int64
	for _, p := range s.Host {
		if role == "" || p.Role == role {
			n += p.Rollup[key]
		}
	}
	return n
}

// guestRSS is the VmRSS of s's guest processes named name.
func guestRSS(s IdleSandbox, name string) int64 {
	var n int64
	for _, p := range s.Guest {
		if p.Name == name {
			n += p.RSSBytes
		}
	}
	return n
}

func cgroupKey(key string) func(IdleSandbox) int64 {
	return func(s IdleSandbox) int64 { return s.Cgroup[key] }
}

func hostKey(role, key string) func(IdleSandbox) int64 {
	return func(s IdleSandbox) int64 { return roleSum(s, role, key) }
}

// private is a process's memory no other process maps.
func private(role string) func(IdleSandbox) int64 {
	return func(s IdleSandbox) int64 {
		return roleSum(s, role, "Private_Dirty") + roleSum(s, role, "Private_Clean")
	}
}

var idleRows = []idleRow{
	{"cgroup usage", cgroupKey("usage")},
	{"  rss (anon: sentry, gofer heaps)", cgroupKey("rss")},
	{"  shmem (guest memory file)", cgroupKey("shmem")},
	{"  cache (with shmem)", cgroupKey("cache")},
	{"  kmem (page tables, stacks, slab)", cgroupKey("kmem")},
	{"sentry RSS", hostKey("sentry", "Rss")},
	{"sentry PSS", hostKey("sentry", "Pss")},
	{"sentry private", private("sentry")},
	{"sentry anon (PSS)", hostKey("sentry", "Pss_Anon")},
	{"sentry guest memory (PSS)", hostKey("sentry", "Pss_Shmem")},
	{"gofer RSS", hostKey("gofer", "Rss")},
	{"gofer PSS", hostKey("gofer", "Pss")},
	{"gofer private", private("gofer")},
	{"stubs PSS", hostKey("stub", "Pss")},
	{"stubs guest memory (PSS)", hostKey("stub", "Pss_Shmem")},
	{"page tables (VmPTE, all)", hostKey("", "VmPTE")},
	{"guest envd VmRSS", func(s IdleSandbox) int64 { return guestRSS(s, "envd") }},
	{"guest python3 VmRSS", func(s IdleSandbox) int64 { return guestRSS(s, "python3") }},
}

// meminfoRows are the host-wide meminfo keys whose change per sandbox
// says what kind of memory the sandboxes took.
var meminfoRows = []string{"MemAvailable", "MemFree", "AnonPages", "Shmem", "Cached", "PageTables", "KernelStack", "SUnreclaim", "SReclaimable"}

// WriteTable prints the per-sandbox cost and its breakdown (medians over
// the sandboxes), then the host-wide meminfo changes per sandbox.
func (r *IdleResult) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "idle sandboxes: %d\n", r.Sandboxes)
	fmt.Fprintf(w, "host MemAvailable drop per sandbox: %s (the server's other sandboxes grew by %s MiB meanwhile, left out)\n",
		mibText(r.AvailableDropPerSandbox()), mibText(r.OthersAfter-r.OthersBefore))
	if own, low := r.AvailableDropBelowCgroup(); low {
		fmt.Fprintf(w, "  LOW: below what a sandbox's own cgroup holds (%s MiB): the host freed memory elsewhere during the run (a server or sandboxes stopped just before it); read the cgroup line, or run again on a quiet host\n",
			mibText(own))
	}
	fmt.Fprintf(w, "host CPU per idle sandbox: %.2f CPU-ms/s (host busy %.3f cores before, %.3f idle)\n",
		r.CPUPerSandbox()*1000, r.BusyBefore, r.BusyAfter)
	if r.OwnCPURead > 0 {
		fmt.Fprintf(w, "CPU per idle sandbox in its own cgroup: %.2f CPU-ms/s (median of %d; without the server's and the warm pool's)\n",
			r.OwnCPU*1000, r.OwnCPURead)
	}
	if h := r.Held(); h.Overcommit > 0 {
		fmt.Fprintf(w, "held before admission refuses: %d (memoryMB %d, overcommit %g, %s binds first)\n", h.Max, h.MemoryMB, h.Overcommit, h.Bound)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(tw, "PER SANDBOX (MEDIAN)\tMiB\t")
	for _, row := range idleRows {
		fmt.Fprintf(tw, "%s\t%s\t\n", row.name, mibText(idleMedian(r.Each, row.of)))
	}
	fmt.Fprintln(tw, "\t\t")
	fmt.Fprintln(tw, "MEMINFO CHANGE PER SANDBOX\tMiB\t")
	for _, k := range meminfoRows {
		d := int64(0)
		if r.Sandboxes > 0 {
			d = (r.After[k] - r.Before[k]) / int64(r.Sandboxes)
		}
		fmt.Fprintf(tw, "%s\t%s\t\n", k, mibText(d))
	}
	return tw.Flush()
}

// idleMedian is the median of of over each, 0 for none.
func idleMedian(each []IdleSandbox, of func(IdleSandbox) int64) int64 {
	v := make([]int64, len(each))
	for i, s := range each {
		v[i] = of(s)
	}
	return medianOf(v)
}

// mibText formats bytes as MiB with two decimals.
func mibText(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 2, 64) }

// HeldEstimate is how many idle sandboxes the cluster would hold before
// admission refused one: those held now, plus what each ready node could
// still take by its rule, the lesser of what its overcommit leaves of
// configured memory (memoryMB a sandbox) and what its high-water mark
// leaves of real memory (perSandbox bytes each, as measured).
type HeldEstimate struct {
	Held, Max int
	// MemoryMB is a sandbox's configured memory and Overcommit the first
	// node's rule; Bound says which limit binds first ("overcommit" or
	// "high water"; the last node's, when nodes differ).
	MemoryMB   int
	Overcommit float64
	Bound      string
}

// EstimateHeld applies each ready node's admission rule to its last
// report. A node that does not report its rule or host memory adds
// nothing.
func EstimateHeld(nodes []client.Node, held, memoryMB int, perSandbox int64) HeldEstimate {
	e := HeldEstimate{Held: held, Max: held, MemoryMB: memoryMB}
	if memoryMB <= 0 || perSandbox <= 0 {
		return e
	}
	for _, n := range nodes {
		if n.State != "ready" || n.MemoryOvercommit <= 0 || n.HostMemoryMB <= 0 {
			continue
		}
		if e.Overcommit == 0 {
			e.Overcommit = n.MemoryOvercommit
		}
		byCommit := (int(n.MemoryOvercommit*float64(n.Capacity.MemoryMB)) - n.Usage.CommittedMemoryMB) / memoryMB
		freeBytes := (n.MemoryHighWater*float64(n.HostMemoryMB) - float64(n.Usage.MemoryMB)) * (1 << 20)
		byMemory := int(freeBytes / float64(perSandbox))
		extra := max(0, min(byCommit, byMemory))
		if byCommit <= byMemory {
			e.Bound = "overcommit"
		} else {
			e.Bound = "high water"
		}
		e.Max += extra
	}
	return e
}
