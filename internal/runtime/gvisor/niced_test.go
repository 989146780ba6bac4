package gvisor

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/runtime/cgroups"
)

// TestNicedForks: what niced starts runs at the lowest priority, and the
// caller's own forks do not, before or after.
func TestNicedForks(t *testing.T) {
	nice := func() string {
		t.Helper()
		out, err := exec.Command("nice").Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	before := nice()
	if before == strconv.Itoa(backgroundNice) {
		t.Fatalf("the test runs at nice %s already: it cannot tell", before)
	}
	var inside string
	if err := niced(func() error { inside = nice(); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != strconv.Itoa(backgroundNice) {
		t.Errorf("a process started by niced's fn runs at nice %s, want %d", inside, backgroundNice)
	}
	for range 20 { // any thread the caller's goroutine may land on
		if after := nice(); after != before {
			t.Fatalf("after niced, the caller's forks run at nice %s, want %s", after, before)
		}
	}
}

// TestPrestartedRunsBehind: a prestarted sandbox runs at the lowest CPU
// weight (its cgroup) and its processes at the lowest priority, until
// Foreground gives its cgroup the default weight; another sandbox runs
// at the default from the start.
func TestPrestartedRunsBehind(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	weight := func(id string) string {
		t.Helper()
		file := filepath.Join("/sys/fs/cgroup/cpu", f.driver.cgroup(id), "cpu.shares")
		if f.driver.cg.Version() == cgroups.V2 {
			file = filepath.Join("/sys/fs/cgroup", f.driver.cg.Path(f.driver.cgroup(id)), "cpu.weight")
		}
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("reading the CPU weight of %s: %v", id, err)
		}
		return strings.TrimSpace(string(b))
	}
	low, normal := "2", "1024"
	if f.driver.cg.Version() == cgroups.V2 {
		low, normal = "1", "100"
	}
	niceOf := func(id string) string {
		t.Helper()
		pid, err := readPid(filepath.Join(f.driver.sandboxDir(id), "pid"))
		if err != nil {
			t.Fatal(err)
		}
		fields, err := procStat(pid)
		if err != nil {
			t.Fatal(err)
		}
		return fields[16]
	}

	pooled, slot := f.spec(t, "gvpre1")
	pooled.Prestarted = true
	if err := f.driver.Create(ctx, pooled); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, slot.HostAddr)
	if got := weight("gvpre1"); got != low {
		t.Errorf("a prestarted sandbox's CPU weight is %s, want the lowest, %s", got, low)
	}
	if got := niceOf("gvpre1"); got != strconv.Itoa(backgroundNice) {
		t.Errorf("a prestarted sandbox's process runs at nice %s, want %d", got, backgroundNice)
	}
	if err := f.driver.Foreground(ctx, "gvpre1"); err != nil {
		t.Fatal(err)
	}
	if got := weight("gvpre1"); got != normal {
		t.Errorf("after Foreground the CPU weight is %s, want the default, %s", got, normal)
	}
	waitHealth(t, slot.HostAddr)

	fresh, slot2 := f.spec(t, "gvpre2")
	if err := f.driver.Create(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, slot2.HostAddr)
	if got := weight("gvpre2"); got != normal {
		t.Errorf("a sandbox not prestarted has CPU weight %s, want the default, %s", got, normal)
	}
	if got, want := niceOf("gvpre2"), "0"; got != want {
		t.Errorf("a sandbox not prestarted runs at nice %s, want %s", got, want)
	}
	if err := f.driver.Foreground(ctx, "gvnone"); err == nil {
		t.Error("foregrounding a sandbox that does not exist succeeded")
	}
	for _, id := range []string{"gvpre1", "gvpre2"} {
		if err := f.driver.Kill(ctx, id); err != nil {
			t.Error(err)
		}
	}
	if err := f.driver.Close(); err != nil {
		t.Fatal(err)
	}
}
