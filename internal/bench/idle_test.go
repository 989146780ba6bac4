package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// idleFakeAPI is a server whose sandboxes each have two host processes
// (a sentry and a gofer, written under proc) and a cgroup (under cg), and
// whose guests answer the guest script.
type idleFakeAPI struct {
	t        *testing.T
	proc, cg string
	mu       sync.Mutex
	seq      int
	live     map[string]bool
	started  map[string]bool
	// timeouts are the sandboxes' timeouts, in seconds.
	timeouts []int
}

func (f *idleFakeAPI) Create(ctx context.Context, opts client.CreateOptions) (*client.Sandbox, error) {
	if opts.TemplateID != "tpl" {
		return nil, fmt.Errorf("bad template %q", opts.TemplateID)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seq++
	f.timeouts = append(f.timeouts, opts.Timeout)
	id := fmt.Sprintf("sb%d", f.seq)
	f.live[id] = true
	sentry, gofer := 1000+2*f.seq, 1001+2*f.seq
	dir := filepath.Join(f.cg, "tag", id)
	write(f.t, filepath.Join(dir, "memory.stat"), "rss 10485760\nshmem 4194304\ncache 4194304\n")
	write(f.t, filepath.Join(dir, "memory.usage_in_bytes"), "16777216\n")
	write(f.t, filepath.Join(dir, "cpuacct.usage"), "5000000\n")
	write(f.t, filepath.Join(dir, "memory.kmem.usage_in_bytes"), "2097152\n")
	// A process that ended after the listing is skipped.
	write(f.t, filepath.Join(dir, "cgroup.procs"), fmt.Sprintf("%d\n%d\n99999\n", sentry, gofer))
	for pid, argv0 := range map[int]string{sentry: "runsc-sandbox", gofer: "runsc-gofer"} {
		pdir := filepath.Join(f.proc, fmt.Sprint(pid))
		write(f.t, filepath.Join(pdir, "cmdline"), argv0+"\x00--root=/x\x00"+id+"\x00")
		write(f.t, filepath.Join(pdir, "smaps_rollup"), "00400000-7fff ---p 00000000 00:00 0  [rollup]\nRss:  8192 kB\nPss:  4096 kB\nPrivate_Dirty: 3072 kB\nPrivate_Clean: 1024 kB\nPss_Anon: 3072 kB\n")
		write(f.t, filepath.Join(pdir, "status"), "Name:\texe\nThreads:\t8\nVmPTE:\t     256 kB\n")
	}
	return &client.Sandbox{SandboxID: id, EnvdAccessToken: "tok-" + id}, nil
}

func (f *idleFakeAPI) Run(ctx context.Context, id, cmd string, opts client.RunOptions) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.live[id] || opts.AccessToken != "tok-"+id {
		return -1, fmt.Errorf("run in unknown sandbox %s", id)
	}
	switch cmd {
	case "sleep-in-background":
		f.started[id] = true
		return 0, nil
	case guestScript:
		if !f.started[id] {
			return -1, fmt.Errorf("%s read before its idle command ran", id)
		}
		// A process that ended half-way has no VmRSS.
		fmt.Fprint(opts.Stdout, "1 envd 24576\n9 python3 14336\n12 bash\n")
		return 0, nil
	}
	return -1, fmt.Errorf("unexpected command %q", cmd)
}

func (f *idleFakeAPI) Kill(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.live[id] {
		return fmt.Errorf("kill of unknown sandbox %s", id)
	}
	delete(f.live, id)
	return nil
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestMeasureIdle(t *testing.T) {
	root := t.TempDir()
	api := &idleFakeAPI{t: t, proc: filepath.Join(root, "proc"), cg: filepath.Join(root, "cg"), live: map[string]bool{}, started: map[string]bool{}}
	meminfo := filepath.Join(root, "meminfo")
	write(t, meminfo, "MemAvailable: 1048576 kB\nShmem: 0 kB\n")
	opts := IdleOptions{
		Count: 3, Concurrency: 2, Template: "tpl", Command: "sleep-in-background", CgroupParent: "tag",
		Settle: time.Millisecond, meminfo: meminfo, cgroupRoot: api.cg, cpuRoot: api.cg, procRoot: api.proc,
	}
	// The server's warm pool holds one sandbox before; a second joins it
	// as the creates teach it (dropOnStart), which is not theirs to pay.
	write(t, filepath.Join(api.cg, "tag", "pool1", "memory.usage_in_bytes"), "4194304\n")
	res, err := MeasureIdle(context.Background(), &dropOnStart{idleFakeAPI: api, meminfo: meminfo, t: t}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(api.live) != 0 {
		t.Errorf("sandboxes left running: %v", api.live)
	}
	// Each outlives the start of all of them (a second each, at most).
	for _, to := range api.timeouts {
		if to < sandboxTimeout+opts.Count {
			t.Errorf("a sandbox created with a timeout of %d s, want at least %d", to, sandboxTimeout+opts.Count)
		}
	}
	if res.Sandboxes != 3 || len(res.Each) != 3 {
		t.Fatalf("measured %d sandboxes, %d read; want 3", res.Sandboxes, len(res.Each))
	}
	if got := res.AvailableDropPerSandbox(); got != 10<<20 {
		t.Errorf("MemAvailable drop per sandbox = %d, want 10 MiB", got)
	}
	s := res.Each[0]
	if len(s.Host) != 2 || s.Cgroup["usage"] != 16<<20 || s.Cgroup["kmem"] != 2<<20 || s.Cgroup["shmem"] != 4<<20 {
		t.Errorf("sandbox %s read as %+v", s.ID, s)
	}
	roles := map[string]bool{}
	for _, p := range s.Host {
		roles[p.Role] = true
		if p.Rollup["Pss"] != 4<<20 || p.Rollup["VmPTE"] != 256<<10 {
			t.Errorf("process %d read as %v", p.PID, p.Rollup)
		}
	}
	if !roles["sentry"] || !roles["gofer"] {
		t.Errorf("roles = %v, want a sentry and a gofer", roles)
	}
	if len(s.Guest) != 2 || guestRSS(s, "envd") != 24<<20 {
		t.Errorf("guest processes = %+v, want envd (24 MiB) and python3", s.Guest)
	}

	// The fake's cgroups use no CPU: all three are read, at nothing.
	if res.OwnCPURead != 3 || res.OwnCPU != 0 {
		t.Errorf("own CPU read as %v CPU-s/s from %d cgroups, want 0 from 3", res.OwnCPU, res.OwnCPURead)
	}

	var out bytes.Buffer
	if err := res.WriteTable(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"host MemAvailable drop per sandbox: 10.00 (the server's other sandboxes grew by 6.00 MiB",
		"host CPU per idle sandbox: ",
		"CPU per idle sandbox in its own cgroup: 0.00 CPU-ms/s (median of 3;",
		"cgroup usage   16.00",
		"sentry private    4.00",
		"page tables (VmPTE, all)    0.50",
		"guest envd VmRSS   24.00",
		"MemAvailable  -12.00",
		// The fake's drop, 10 MiB a sandbox, is below its cgroups' 16.
		"LOW: below what a sandbox's own cgroup holds (16.00 MiB)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestAvailableDropBelowCgroup: the table flags a MemAvailable drop below
// the sandboxes' own cgroups (memory freed elsewhere during the run), and
// only such a drop.
func TestAvailableDropBelowCgroup(t *testing.T) {
	each := []IdleSandbox{{Cgroup: map[string]int64{"usage": 14 << 20}}, {Cgroup: map[string]int64{"usage": 15 << 20}}, {Cgroup: map[string]int64{"usage": 30 << 20}}}
	for _, c := range []struct {
		name    string
		dropMiB int64
		low     bool
	}{
		{"below the median cgroup", 8, true},
		{"at it", 15, false},
		{"above it (the server's share, kernel memory outside the cgroup)", 16, false},
	} {
		r := &IdleResult{Sandboxes: 3, Each: each,
			Before: map[string]int64{"MemAvailable": 1 << 30}, After: map[string]int64{"MemAvailable": 1<<30 - 3*c.dropMiB<<20}}
		own, low := r.AvailableDropBelowCgroup()
		if own != 15<<20 || low != c.low {
			t.Errorf("%s: AvailableDropBelowCgroup() = %d, %v; want 15 MiB, %v", c.name, own, low, c.low)
		}
		var out bytes.Buffer
		if err := r.WriteTable(&out); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(out.String(), "LOW: below"); got != c.low {
			t.Errorf("%s: table flags the drop as low: %v, want %v:\n%s", c.name, got, c.low, out.String())
		}
	}
	if _, low := (&IdleResult{Sandboxes: 3}).AvailableDropBelowCgroup(); low {
		t.Error("no sandbox read: flagged low")
	}
}

// dropOnStart lowers the fake host's MemAvailable by 36 MiB, 10 MiB per
// sandbox and 6 MiB for a pooled sandbox that starts beside them, when
// sb3 starts its idle command (before the settle ends).
type dropOnStart struct {
	*idleFakeAPI
	t       *testing.T
	meminfo string
	once    sync.Once
}

func (d *dropOnStart) Run(ctx context.Context, id, cmd string, opts client.RunOptions) (int, error) {
	if cmd == "sleep-in-background" && id == "sb3" {
		d.once.Do(func() {
			write(d.t, d.meminfo, "MemAvailable: 1011712 kB\nShmem: 0 kB\n")
			write(d.t, filepath.Join(d.cg, "tag", "pool2", "memory.usage_in_bytes"), "6291456\n")
		})
	}
	return d.idleFakeAPI.Run(ctx, id, cmd, opts)
}

func TestMeasureIdleCreateFailureKillsTheOthers(t *testing.T) {
	root := t.TempDir()
	api := &idleFakeAPI{t: t, proc: filepath.Join(root, "proc"), cg: filepath.Join(root, "cg"), live: map[string]bool{}, started: map[string]bool{}}
	meminfo := filepath.Join(root, "meminfo")
	write(t, meminfo, "MemAvailable: 1048576 kB\n")
	_, err := MeasureIdle(context.Background(), api, IdleOptions{
		Count: 3, Template: "tpl", Command: "exit 3", CgroupParent: "tag",
		Settle: time.Millisecond, meminfo: meminfo, cgroupRoot: api.cg, procRoot: api.proc,
	})
	if err == nil || !strings.Contains(err.Error(), "starting the idle command") {
		t.Fatalf("err = %v, want the idle command's failure", err)
	}
	if len(api.live) != 0 {
		t.Errorf("sandboxes left running after a failure: %v", api.live)
	}
}

func TestParseGuestProcesses(t *testing.T) {
	got := parseGuestProcesses("1 envd 100\nnot a line\n7 sh\n8 python3 20\n")
	if len(got) != 2 || got[0] != (GuestProcess{PID: 1, Name: "envd", RSSBytes: 100 << 10}) || got[1].Name != "python3" {
		t.Errorf("parseGuestProcesses = %+v", got)
	}
}

// TestOwnCPU: a sandbox's own CPU is its cgroup's usage over the
// window; the median is taken over those read at both ends, and a counter
// that went back (a cgroup made again under the same name) is left out.
func TestOwnCPU(t *testing.T) {
	dir := t.TempDir()
	for id, v := range map[string]string{"a": "1000000\n", "b": "3000000\n", "c": "junk\n"} {
		write(t, filepath.Join(dir, id, "cpuacct.usage"), v)
	}
	before := readCPUUsage(dir, []string{"a", "b", "c", "gone"})
	if len(before) != 2 || before["a"] != 1e6 || before["b"] != 3e6 {
		t.Fatalf("readCPUUsage = %v, want a and b only", before)
	}
	before["d"], before["e"] = 0, 9e6
	// Over 2 s: a used 2 ms, b 6 ms, d 20 ms; e went back; c never read.
	after := map[string]int64{"a": 3e6, "b": 9e6, "d": 20e6, "e": 1e6}
	got, n := ownCPU(before, after, 2*time.Second)
	if n != 3 || got < 0.00299 || got > 0.00301 {
		t.Errorf("ownCPU = %v from %d, want 0.003 (b's 3 CPU-ms/s, the median) from 3", got, n)
	}
	if got, n := ownCPU(before, nil, time.Second); got != 0 || n != 0 {
		t.Errorf("ownCPU with nothing read after = %v from %d, want 0 from 0", got, n)
	}
}

// TestCPUPerSandbox: an idle sandbox's CPU is what the host's busy cores
// grew by, shared out; a host busier before than after costs nothing.
func TestCPUPerSandbox(t *testing.T) {
	r := &IdleResult{Sandboxes: 50, BusyBefore: 0.05, BusyAfter: 0.20}
	if got := r.CPUPerSandbox(); got < 0.00299 || got > 0.00301 {
		t.Errorf("CPUPerSandbox = %v, want 0.003 (3 CPU-ms/s)", got)
	}
	r.BusyAfter = 0.01
	if got := r.CPUPerSandbox(); got != 0 {
		t.Errorf("CPUPerSandbox = %v with the host quieter after, want 0", got)
	}
	if got := (&IdleResult{}).CPUPerSandbox(); got != 0 {
		t.Errorf("CPUPerSandbox of none = %v", got)
	}
}
