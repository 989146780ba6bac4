package cgroups

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// These tests run against fake trees: directories holding the files each
// kernel version shows. cgroup v2 cannot be mounted with controllers on
// the machines the project is built on (they boot v1), so the v2 half is
// checked only this way there; on a v2 host the driver's privileged tests
// run it for real.

// files writes name → content under root.
func files(t *testing.T, root string, m map[string]string) {
	t.Helper()
	for name, content := range m {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func wantFile(t *testing.T, root, name, want string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, name))
	if err != nil {
		t.Fatalf("reading %s: %v", name, err)
	}
	if got := strings.TrimSpace(string(b)); got != want {
		t.Fatalf("%s = %q, want %q", name, got, want)
	}
}

// fakeV1 is a v1 host: a tmpfs of per-controller trees, with a v2 tree
// without controllers beside them (as systemd's hybrid mode mounts).
func fakeV1(t *testing.T) string {
	root := t.TempDir()
	for _, c := range []string{"memory", "cpu", "cpuacct", "pids", "devices", "freezer", "unified"} {
		if err := os.Mkdir(filepath.Join(root, c), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files(t, root, map[string]string{"unified/cgroup.procs": ""})
	return root
}

func TestV1(t *testing.T) {
	root := fakeV1(t)
	h, err := Open(Options{Root: root, SelfCgroup: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Version() != V1 {
		t.Fatalf("a tree of controller directories detected as %v", h.Version())
	}
	if got := h.Path("aenv/sb1"); got != "/aenv/sb1" {
		t.Fatalf("runsc path %q, want /aenv/sb1", got)
	}
	if got := h.Path("/../../etc"); got != "/etc" {
		t.Fatalf("a name reaching out of the tree became %q", got)
	}
	lim := Limits{MemoryBytes: 256 << 20, CPUQuota: 200 * time.Millisecond, CPUPeriod: 100 * time.Millisecond, Pids: 300}
	if err := h.Create("/aenv/sb1", lim); err != nil {
		t.Fatal(err)
	}
	wantFile(t, root, "memory/aenv/sb1/memory.limit_in_bytes", "268435456")
	wantFile(t, root, "cpu/aenv/sb1/cpu.cfs_quota_us", "200000")
	wantFile(t, root, "cpu/aenv/sb1/cpu.cfs_period_us", "100000")
	wantFile(t, root, "pids/aenv/sb1/pids.max", "300")
	if _, err := os.Stat(filepath.Join(root, "cpuacct/aenv/sb1")); err != nil {
		t.Fatalf("no cpuacct cgroup, which the CPU usage is read from: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "devices/aenv/sb1")); err == nil {
		t.Fatal("made a devices cgroup: that is runsc's to make and remove")
	}
	// A parent's limit alone touches only its own file.
	if err := h.Create("/aenv", Limits{Pids: 1000}); err != nil {
		t.Fatal(err)
	}
	wantFile(t, root, "pids/aenv/pids.max", "1000")
	if _, err := os.Stat(filepath.Join(root, "memory/aenv/memory.limit_in_bytes")); err == nil {
		t.Fatal("a zero memory limit was written")
	}

	// What the kernel shows while tasks run.
	files(t, root, map[string]string{
		"memory/aenv/sb1/memory.usage_in_bytes": "123456\n",
		"memory/aenv/sb1/memory.stat":           "cache 30000\nrss 90000\ninactive_file 999\nactive_file 4000\ntotal_cache 30000\ntotal_inactive_file 23456\n",
		"memory/aenv/sb1/memory.oom_control":    "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
		"cpuacct/aenv/sb1/cpuacct.usage":        "1500000000\n",
		"pids/aenv/sb1/pids.current":            "42\n",
	})
	// Usage less the inactive page cache (the hierarchy's: total_).
	if m, err := h.Memory("/aenv/sb1"); err != nil || m != 100000 {
		t.Fatalf("memory %d, %v; want 123456 - 23456", m, err)
	}
	if n, err := h.OOMKills("/aenv/sb1"); err != nil || n != 2 {
		t.Fatalf("OOM kills %d, %v; want 2", n, err)
	}
	if p, err := h.Pids("/aenv/sb1"); err != nil || p != (Pids{Current: 42, Max: 300}) {
		t.Fatalf("pids %+v, %v; want 42 of 300", p, err)
	}
	c, err := h.CPU("/aenv/sb1")
	if err != nil || c != (CPU{Usage: 1500 * time.Millisecond, Quota: 200 * time.Millisecond, Period: 100 * time.Millisecond}) {
		t.Fatalf("CPU %+v, %v; want 1.5s used of 200ms per 100ms", c, err)
	}
	files(t, root, map[string]string{"cpu/aenv/sb1/cpu.cfs_quota_us": "-1\n", "pids/aenv/sb1/pids.max": "max\n"})
	if c, err := h.CPU("/aenv/sb1"); err != nil || c.Quota != 0 {
		t.Fatalf("CPU %+v, %v; want no quota for -1", c, err)
	}
	if p, err := h.Pids("/aenv/sb1"); err != nil || p.Max != 0 {
		t.Fatalf("pids %+v, %v; want no bound for max", p, err)
	}
	// Weights on v2's scale become shares, 1024 for the default, within
	// the kernel's bounds.
	for _, w := range []struct {
		weight uint64
		shares string
	}{{DefaultCPUWeight, "1024"}, {MinCPUWeight, "10"}, {0, "2"}, {50, "512"}, {1 << 20, "262144"}} {
		if err := h.SetCPUWeight("/aenv/sb1", w.weight); err != nil {
			t.Fatal(err)
		}
		wantFile(t, root, "cpu/aenv/sb1/cpu.shares", w.shares)
	}
	if _, err := h.Memory("/aenv/missing"); err == nil || !strings.Contains(err.Error(), "/aenv/missing") {
		t.Fatalf("reading a missing cgroup: %v, want an error naming it", err)
	}

	// Remove takes every controller's directory (real cgroup directories
	// are empty to rmdir; fake ones must be).
	for _, c := range v1Controllers {
		if err := os.MkdirAll(filepath.Join(root, c, "aenv/gone"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Remove("/aenv/gone"); err != nil {
		t.Fatal(err)
	}
	for _, c := range v1Controllers {
		if _, err := os.Stat(filepath.Join(root, c, "aenv/gone")); !os.IsNotExist(err) {
			t.Fatalf("%s cgroup survived Remove: %v", c, err)
		}
	}
	if err := h.Remove("/aenv/gone"); err != nil {
		t.Fatalf("removing a missing cgroup: %v", err)
	}
}

// fakeV2 is a unified host where systemd started the service in
// /system.slice/aenv.service with Delegate=yes: the unit's cgroup is
// given cpu, memory and pids and holds the service's process, pid 4242.
func fakeV2(t *testing.T) (root, self string) {
	root = t.TempDir()
	files(t, root, map[string]string{
		"cgroup.controllers":                                 "cpuset cpu io memory hugetlb pids rdma misc\n",
		"cgroup.subtree_control":                             "cpuset cpu io memory pids\n",
		"system.slice/cgroup.controllers":                    "cpuset cpu io memory pids\n",
		"system.slice/cgroup.subtree_control":                "cpu memory pids\n",
		"system.slice/aenv.service/cgroup.controllers":       "cpu memory pids\n",
		"system.slice/aenv.service/cgroup.subtree_control":   "",
		"system.slice/aenv.service/cgroup.procs":             "4242\n",
		"system.slice/aenv.service/memory.current":           "1000\n",
		"system.slice/cron.service/cgroup.procs":             "77\n",
		"system.slice/cron.service/cgroup.controllers":       "cpu memory pids\n",
		"system.slice/cron.service/cgroup.subtree_control":   "",
		"system.slice/aenv.service/ignored-by-test/whatever": "",
	})
	self = filepath.Join(t.TempDir(), "cgroup")
	files(t, filepath.Dir(self), map[string]string{"cgroup": "0::/system.slice/aenv.service\n"})
	return root, self
}

func TestV2(t *testing.T) {
	root, self := fakeV2(t)
	h, err := Open(Options{Root: root, SelfCgroup: self, Pid: 4242})
	if err != nil {
		t.Fatal(err)
	}
	if h.Version() != V2 {
		t.Fatalf("a unified tree detected as %v", h.Version())
	}
	if got := h.Path("/aenv/sb1"); got != "/system.slice/aenv.service/aenv/sb1" {
		t.Fatalf("runsc path %q, want it under the service's cgroup", got)
	}

	// The first cgroup moves the service out of its unit's cgroup (v2
	// lets a cgroup hold processes or give controllers, not both), then
	// gives the controllers to the subtree.
	if err := h.Create("/aenv", Limits{Pids: 1000}); err != nil {
		t.Fatal(err)
	}
	svc := "system.slice/aenv.service/"
	wantFile(t, root, svc+ServerLeaf+"/cgroup.procs", "4242")
	wantFile(t, root, svc+"cgroup.subtree_control", "+cpu +memory +pids")
	wantFile(t, root, svc+"aenv/pids.max", "1000")
	if _, err := os.Stat(filepath.Join(root, svc, "aenv/cgroup.subtree_control")); err == nil {
		t.Fatal("a leaf cgroup was made to give controllers to children")
	}

	// What the kernel shows now: the process moved, the controllers given.
	files(t, root, map[string]string{
		svc + "cgroup.procs":                "",
		svc + "cgroup.subtree_control":      "cpu memory pids\n",
		svc + "aenv/cgroup.controllers":     "cpu memory pids\n",
		svc + "aenv/cgroup.subtree_control": "",
	})
	lim := Limits{MemoryBytes: 512 << 20, CPUQuota: 100 * time.Millisecond, CPUPeriod: 100 * time.Millisecond, Pids: 300}
	if err := h.Create("/aenv/step-1", lim); err != nil {
		t.Fatal(err)
	}
	wantFile(t, root, svc+"aenv/cgroup.subtree_control", "+cpu +memory +pids")
	wantFile(t, root, svc+"aenv/step-1/memory.max", "536870912")
	wantFile(t, root, svc+"aenv/step-1/cpu.max", "100000 100000")
	wantFile(t, root, svc+"aenv/step-1/pids.max", "300")

	files(t, root, map[string]string{
		svc + "aenv/step-1/memory.current": "654321\n",
		svc + "aenv/step-1/memory.stat":    "anon 500000\nfile 154321\nactive_file 100000\ninactive_file 54321\n",
		svc + "aenv/step-1/memory.events":  "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n",
		svc + "aenv/step-1/pids.current":   "17\n",
		svc + "aenv/step-1/cpu.stat":       "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
	})
	if m, err := h.Memory("/aenv/step-1"); err != nil || m != 600000 {
		t.Fatalf("memory %d, %v; want memory.current's 654321 less inactive_file's 54321", m, err)
	}
	if n, err := h.OOMKills("/aenv/step-1"); err != nil || n != 1 {
		t.Fatalf("OOM kills %d, %v; want memory.events' oom_kill 1", n, err)
	}
	if p, err := h.Pids("/aenv/step-1"); err != nil || p != (Pids{Current: 17, Max: 300}) {
		t.Fatalf("pids %+v, %v; want 17 of 300", p, err)
	}
	c, err := h.CPU("/aenv/step-1")
	if err != nil || c != (CPU{Usage: 2500 * time.Millisecond, Quota: 100 * time.Millisecond, Period: 100 * time.Millisecond}) {
		t.Fatalf("CPU %+v, %v; want 2.5s used of 100ms per 100ms", c, err)
	}
	for _, w := range []struct {
		weight uint64
		want   string
	}{{DefaultCPUWeight, "100"}, {MinCPUWeight, "1"}, {0, "1"}, {1 << 20, "10000"}} {
		if err := h.SetCPUWeight("/aenv/step-1", w.weight); err != nil {
			t.Fatal(err)
		}
		wantFile(t, root, svc+"aenv/step-1/cpu.weight", w.want)
	}
	files(t, root, map[string]string{svc + "aenv/step-1/cpu.max": "max 100000\n"})
	if c, err := h.CPU("/aenv/step-1"); err != nil || c.Quota != 0 || c.Usage != 2500*time.Millisecond {
		t.Fatalf("CPU %+v, %v; want no quota for max", c, err)
	}

	if err := os.Mkdir(filepath.Join(root, svc, "aenv/gone"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := h.Remove("/aenv/gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, svc, "aenv/gone")); !os.IsNotExist(err) {
		t.Fatalf("cgroup survived Remove: %v", err)
	}
	if err := h.Remove("/"); err == nil {
		t.Fatal("removing the service's own cgroup succeeded")
	}

	// A later Open in the moved process finds the same subtree.
	files(t, filepath.Dir(self), map[string]string{"cgroup": "0::/system.slice/aenv.service/" + ServerLeaf + "\n"})
	again, err := Open(Options{Root: root, SelfCgroup: self, Pid: 4242})
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Path("/aenv/sb1"); got != "/system.slice/aenv.service/aenv/sb1" {
		t.Fatalf("runsc path after the move %q, want the same subtree", got)
	}
}

// TestV2NotDelegated: where the service cannot give controllers to
// sandboxes, Create says why and how to run it.
func TestV2NotDelegated(t *testing.T) {
	t.Run("other processes", func(t *testing.T) {
		root, self := fakeV2(t)
		files(t, filepath.Dir(self), map[string]string{"cgroup": "0::/system.slice/cron.service\n"})
		h, err := Open(Options{Root: root, SelfCgroup: self, Pid: 4242})
		if err != nil {
			t.Fatal(err)
		}
		err = h.Create("/aenv", Limits{})
		if err == nil || !strings.Contains(err.Error(), "77") || !strings.Contains(err.Error(), "Delegate=yes") {
			t.Fatalf("creating in a cgroup shared with other processes: %v, want an error naming them and the fix", err)
		}
	})
	t.Run("controller missing", func(t *testing.T) {
		root, self := fakeV2(t)
		files(t, root, map[string]string{"system.slice/aenv.service/cgroup.controllers": "cpu memory\n"})
		h, err := Open(Options{Root: root, SelfCgroup: self, Pid: 4242})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Create("/aenv", Limits{}); err == nil || !strings.Contains(err.Error(), "pids") {
			t.Fatalf("creating without the pids controller: %v, want an error naming it", err)
		}
	})
	t.Run("root cgroup", func(t *testing.T) {
		// In a container or a host without systemd the service may run in
		// the root cgroup, which may hold processes and give controllers.
		root, self := fakeV2(t)
		files(t, filepath.Dir(self), map[string]string{"cgroup": "0::/\n"})
		files(t, root, map[string]string{"cgroup.procs": "1\n4242\n", "cgroup.subtree_control": ""})
		h, err := Open(Options{Root: root, SelfCgroup: self, Pid: 4242})
		if err != nil {
			t.Fatal(err)
		}
		if got := h.Path("/aenv/sb1"); got != "/aenv/sb1" {
			t.Fatalf("runsc path %q from the root cgroup, want /aenv/sb1", got)
		}
		if err := h.Create("/aenv", Limits{Pids: 10}); err != nil {
			t.Fatal(err)
		}
		wantFile(t, root, "cgroup.subtree_control", "+cpu +memory +pids")
		wantFile(t, root, "aenv/pids.max", "10")
		if _, err := os.Stat(filepath.Join(root, ServerLeaf)); err == nil {
			t.Fatal("moved out of the root cgroup, which needs no move")
		}
	})
}

func TestOpenUnknown(t *testing.T) {
	if _, err := Open(Options{Root: t.TempDir()}); err == nil {
		t.Fatal("an empty directory was taken for a cgroup hierarchy")
	}
	root := t.TempDir()
	files(t, root, map[string]string{"cgroup.controllers": "cpu memory pids\n"})
	self := filepath.Join(t.TempDir(), "cgroup")
	files(t, filepath.Dir(self), map[string]string{"cgroup": "4:memory:/x\n1:cpu:/\n"})
	if _, err := Open(Options{Root: root, SelfCgroup: self}); err == nil {
		t.Fatal("a v2 host with no v2 entry for this process was accepted")
	}
}

// TestWorkingSet: a cache that grew between the two reads never makes
// the working set wrap below zero.
func TestWorkingSet(t *testing.T) {
	for _, tc := range []struct{ usage, inactive, want uint64 }{
		{100, 30, 70}, {100, 0, 100}, {100, 100, 0}, {100, 130, 0},
	} {
		if got := workingSet(tc.usage, tc.inactive); got != tc.want {
			t.Errorf("workingSet(%d, %d) = %d, want %d", tc.usage, tc.inactive, got, tc.want)
		}
	}
}
