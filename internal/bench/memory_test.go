package bench

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseMeminfo(t *testing.T) {
	in := "MemTotal:       24683776 kB\nMemAvailable:   23500000 kB\nShmem:             12288 kB\nHugePages_Total:       0\n"
	got, err := parseMeminfo(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if got["MemAvailable"] != 23500000<<10 || got["Shmem"] != 12288<<10 || got["HugePages_Total"] != 0 || len(got) != 3 {
		t.Errorf("parseMeminfo = %v", got)
	}
	if _, err := parseMeminfo(strings.NewReader("MemTotal: 1 kB\n")); err == nil {
		t.Error("parseMeminfo accepted a meminfo without MemAvailable")
	}
	if _, err := parseMeminfo(strings.NewReader("MemAvailable: lots kB\n")); err == nil {
		t.Error("parseMeminfo accepted a non-number")
	}
}

func TestCgroupMemory(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "tag", "sb1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.usage_in_bytes"), []byte("4096\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := cgroupMemory(root, "tag", "sb1"); err != nil || got != 4096 {
		t.Errorf("cgroupMemory = %d, %v; want 4096", got, err)
	}
	if _, err := cgroupMemory(root, "tag", "sb2"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("cgroupMemory of a sandbox without a cgroup: err = %v, want ErrNotExist", err)
	}
	if runtime.GOOS != "linux" {
		return
	}
	s, err := sampleMemory(root, "tag", t.TempDir(), []string{"sb1", "sb2"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Cgroups != 1 || s.CgroupBytes != 4096 || s.AvailableBytes <= 0 {
		t.Errorf("sampleMemory = %+v, want one cgroup of 4096 bytes and MemAvailable", s)
	}
}

// TestSampleMemoryFindsPrepared: a sandbox restored into a prepared one,
// whose cgroup bears that one's name, is found by the host name in its
// sandbox process's bundle (gvisor.WriteBundleFiles' hosts file).
func TestSampleMemoryFindsPrepared(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/meminfo")
	}
	root, proc, bundle := t.TempDir(), t.TempDir(), t.TempDir()
	write := func(path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(root, "tag", "prep1", "memory.usage_in_bytes"), "8192\n")
	write(filepath.Join(root, "tag", "prep1", "cgroup.procs"), "41\n42\n")
	write(filepath.Join(proc, "42", "cmdline"), "runsc-sandbox\x00--root=/r\x00boot\x00--bundle="+bundle+"\x00prep1\x00")
	write(filepath.Join(bundle, "hosts"), "127.0.0.1\tlocalhost\n127.0.1.1\tsb1\n")
	// An unprepared one (by its own id) and one with no cgroup at all.
	write(filepath.Join(root, "tag", "sb2", "memory.usage_in_bytes"), "4096\n")

	s, err := sampleMemory(root, "tag", proc, []string{"sb1", "sb2", "sb3"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Cgroups != 2 || s.CgroupBytes != 8192+4096 {
		t.Errorf("sampleMemory = %+v, want sb1's cgroup (prep1, 8192 bytes) and sb2's (4096)", s)
	}
}

func TestMemoryResultsPerSandbox(t *testing.T) {
	m := MemoryResults{
		Sandboxes: 4,
		Running:   MemorySample{AvailableBytes: 1000 << 20, CgroupBytes: 80 << 20, Cgroups: 4},
		Paused:    MemorySample{AvailableBytes: 1080 << 20},
	}
	if got := m.FreedPerSandbox(); got != 20<<20 {
		t.Errorf("FreedPerSandbox = %d, want 20 MiB", got)
	}
	if got := m.CgroupPerSandbox(); got != 20<<20 {
		t.Errorf("CgroupPerSandbox = %d, want 20 MiB", got)
	}
	m.Paused.AvailableBytes = 960 << 20
	if got := m.FreedPerSandbox(); got != -10<<20 {
		t.Errorf("FreedPerSandbox when pausing cost memory = %d, want -10 MiB", got)
	}
	if (MemoryResults{}).FreedPerSandbox() != 0 || (MemoryResults{}).CgroupPerSandbox() != 0 {
		t.Error("empty results must give 0, not divide by zero")
	}
}

func TestSplitCmdlineAndNamesAny(t *testing.T) {
	args := splitCmdline([]byte("runsc-gofer\x00--bundle=/x/sandboxes/abc\x00gofer\x00abc\x00"))
	if !slices.Equal(args, []string{"runsc-gofer", "--bundle=/x/sandboxes/abc", "gofer", "abc"}) {
		t.Errorf("splitCmdline = %q", args)
	}
	if splitCmdline(nil) != nil {
		t.Error("splitCmdline(nil) not empty")
	}
	want := map[string]bool{"abc": true}
	if !namesAny(args, want) {
		t.Error("namesAny missed the id")
	}
	if namesAny([]string{"sleep", "abcd", "/x/abcd"}, want) {
		t.Error("namesAny matched a longer name")
	}
	if !namesAny([]string{"--root=/run/x/abc"}, want) {
		t.Error("namesAny missed the id at the end of a path")
	}
}

func TestProcessesNaming(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	// sh -c SCRIPT NAME: the shell's $0, and so its command line, is NAME.
	// The script does not end with sleep, which a shell would exec in its
	// own place (dash does), leaving no process of that name.
	name := "aenvbenchtest" + time.Now().Format("150405.000000")
	cmd := exec.Command("/bin/sh", "-c", "sleep 30; exit 0", name)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	// Until the child has exec'd the shell its command line is ours.
	var got []string
	for deadline := time.Now().Add(5 * time.Second); len(got) == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var err error
		if got, err = processesNaming([]string{name}); err != nil {
			t.Fatal(err)
		}
	}
	// The shell may briefly have forked a child (same command line) for
	// sleep: one or two matches, every one naming the test's process.
	if len(got) == 0 || len(got) > 2 {
		t.Errorf("processesNaming = %q, want the shell", got)
	}
	for _, g := range got {
		if !strings.Contains(g, name) {
			t.Errorf("processesNaming returned %q, which does not name %s", g, name)
		}
	}
	if got, _ := processesNaming([]string{name + "x"}); len(got) != 0 {
		t.Errorf("processesNaming of an unused name = %q", got)
	}
}
