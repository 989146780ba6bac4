package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// MemoryResults are the host's memory with PauseCount small sandboxes
// running, then paused, then resumed.
type MemoryResults struct {
	// Sandboxes is how many were paused.
	Sandboxes int
	// Running, Paused and Resumed are read at each stage.
	Running, Paused, Resumed MemorySample
	// LeftProcesses are host processes that still named a paused sandbox
	// in their command line (there should be none).
	LeftProcesses []string
	// Pause and Resume are the latencies of those pauses and resumes.
	Pause, Resume []time.Duration
}

// MemorySample is one reading of the host's memory.
type MemorySample struct {
	// AvailableBytes is MemAvailable and ShmemBytes Shmem in /proc/meminfo
	// (a checkpoint image on tmpfs would show there).
	AvailableBytes, ShmemBytes int64
	// CgroupBytes sums the memory cgroup usage of the sandboxes that have
	// a cgroup; Cgroups is how many do.
	CgroupBytes int64
	Cgroups     int
}

// FreedPerSandbox is the host memory pausing freed, per sandbox (by
// MemAvailable); it can be negative when pausing cost more than it freed.
func (m MemoryResults) FreedPerSandbox() int64 {
	if m.Sandboxes == 0 {
		return 0
	}
	return (m.Paused.AvailableBytes - m.Running.AvailableBytes) / int64(m.Sandboxes)
}

// CgroupPerSandbox is the average cgroup usage of a running sandbox.
func (m MemoryResults) CgroupPerSandbox() int64 {
	if m.Running.Cgroups == 0 {
		return 0
	}
	return m.Running.CgroupBytes / int64(m.Running.Cgroups)
}

// meminfoPath, cgroupRoot, cpuRoot and procRoot are the files the
// memory and idle readings come from.
const (
	meminfoPath = "/proc/meminfo"
	cgroupRoot  = "/sys/fs/cgroup/memory"
	cpuRoot     = "/sys/fs/cgroup/cpuacct"
	procRoot    = "/proc"
)

// sampleMemory reads the host's memory and the cgroups of ids under
// parent, in the memory hierarchy root; proc is /proc (see
// hostnameCgroups).
func sampleMemory(root, parent, proc string, ids []string) (MemorySample, error) {
	f, err := os.Open(meminfoPath)
	if err != nil {
		return MemorySample{}, fmt.Errorf("reading host memory: %w", err)
	}
	defer f.Close()
	info, err := parseMeminfo(f)
	if err != nil {
		return MemorySample{}, fmt.Errorf("reading host memory: %w", err)
	}
	s := MemorySample{AvailableBytes: info["MemAvailable"], ShmemBytes: info["Shmem"]}
	var byHost map[string]string
	for _, id := range ids {
		b, err := cgroupMemory(root, parent, id)
		if errors.Is(err, fs.ErrNotExist) {
			if byHost == nil {
				byHost = hostnameCgroups(filepath.Join(root, parent), proc)
			}
			if name, ok := byHost[id]; ok {
				b, err = cgroupMemory(root, parent, name)
			}
		}
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return s, err
		}
		s.CgroupBytes += b
		s.Cgroups++
	}
	return s, nil
}

// hostnameCgroups maps the host names of the sandboxes whose cgroups are
// in dir to those cgroups' names. A sandbox restored into a prepared one
// (a resume, a fork's child) runs, and has its cgroup, under the prepared
// one's runtime name, which no API tells; its host name is its id. The
// sandbox process (runsc boot --bundle=DIR) is in the cgroup, and its
// bundle holds the guest's hosts file, which the driver rewrites with
// the restored sandbox's host name (the spec keeps the prepared one's).
// What cannot be read (a process that exited meanwhile) is left out.
func hostnameCgroups(dir, proc string) map[string]string {
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return out
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		pids, err := os.ReadFile(filepath.Join(dir, e.Name(), "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, pid := range strings.Fields(string(pids)) {
			if h := bundleHostname(proc, pid); h != "" {
				out[h] = e.Name()
				break
			}
		}
	}
	return out
}

// bundleHostname is the host name (the name of 127.0.1.1) in the hosts
// file of the bundle that process pid's command line names
// (--bundle=DIR or --bundle DIR), if any.
func bundleHostname(proc, pid string) string {
	b, err := os.ReadFile(filepath.Join(proc, pid, "cmdline"))
	if err != nil {
		return ""
	}
	args := splitCmdline(b)
	bundle := ""
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--bundle="); ok {
			bundle = v
		} else if a == "--bundle" && i+1 < len(args) {
			bundle = args[i+1]
		}
	}
	if bundle == "" {
		return ""
	}
	hosts, err := os.ReadFile(filepath.Join(bundle, "hosts"))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(hosts), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "127.0.1.1" {
			return f[1]
		}
	}
	return ""
}

// parseMeminfo reads /proc/meminfo's "Key: value kB" lines into bytes
// (the few counts without a unit, HugePages_*, are left out).
func parseMeminfo(r io.Reader) (map[string]int64, error) {
	out, err := parseKB(r)
	if err != nil {
		return nil, err
	}
	if _, ok := out["MemAvailable"]; !ok {
		return nil, errors.New("no MemAvailable (in kB) in meminfo")
	}
	return out, nil
}

// cgroupMemory is the memory usage of sandbox id's cgroup under parent in
// the cgroup v1 memory hierarchy root; an error wrapping fs.ErrNotExist
// means it has none.
func cgroupMemory(root, parent, id string) (int64, error) {
	v, err := readNumber(filepath.Join(root, parent, id, "memory.usage_in_bytes"))
	if err != nil {
		return 0, fmt.Errorf("reading cgroup of %s: %w", id, err)
	}
	return v, nil
}

// readNumber reads a file that holds one integer, as a cgroup's counters
// do.
func readNumber(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parsing %s: %w", filepath.Base(path), err)
	}
	return v, nil
}

// processesNaming lists "pid: command" for each host process whose
// command line has one of ids as an argument: runsc's sandbox and gofer
// processes end with their container's id.
func processesNaming(ids []string) ([]string, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, fmt.Errorf("listing processes: %w", err)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var out []string
	self := strconv.Itoa(os.Getpid())
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil || e.Name() == self {
			continue
		}
		// A process may exit between the listing and the read.
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if args := splitCmdline(b); namesAny(args, want) {
			out = append(out, e.Name()+": "+strings.Join(args, " "))
		}
	}
	return out, nil
}

// splitCmdline splits /proc/PID/cmdline's NUL-separated arguments.
func splitCmdline(b []byte) []string {
	b = bytes.TrimRight(b, "\x00")
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), "\x00")
}

// namesAny reports whether an argument is one of want, alone or as the
// last element of a path.
func namesAny(args []string, want map[string]bool) bool {
	for _, a := range args {
		if want[a] || want[filepath.Base(a)] {
			return true
		}
	}
	return false
}
