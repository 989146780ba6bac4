package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/testutil"
)

func TestMeasureBareSnapshot(t *testing.T) {
	runsc, rootfs := bareEnv(t)
	if _, err := os.Stat(filepath.Join(rootfs, "usr/bin/python3")); err != nil {
		testutil.Unavailable(t, "the root filesystem has no python3 for the dirty size: "+err.Error())
	}
	// With envd (from `make build`) the containers run it as aenv's do;
	// without, sleep.
	var envd string
	if dir := os.Getenv("AENV_BIN_DIR"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "envd")); err == nil {
			envd = filepath.Join(dir, "envd")
		}
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // to see that the runsc root is removed

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	sizes := []Size{{Name: "small"}, {Name: "16MiB dirty", MemoryMB: 512, DirtyMiB: 16}}
	res, err := MeasureBareSnapshot(ctx, Options{
		SnapshotIterations: 1,
		Sizes:              sizes,
		ForkCounts:         []int{1, 3},
		RunscPath:          runsc, RootFS: rootfs, EnvdPath: envd,
		CPUCount: 2, MemoryMB: 256,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != len(sizes) {
		t.Fatalf("%d sizes measured, want %d", len(res), len(sizes))
	}
	for _, s := range res {
		x := s.Samples
		t.Logf("%s: %+v", s.Size.Name, x)
		for name, samples := range map[string][]time.Duration{
			"snapshot": x.Snapshot, "pause": x.Pause, "resume": x.Resume,
			"resume+command": x.ResumeCommand, "resume, prepared": x.ResumePrepared, "from snapshot": x.FromSnapshot,
			"fork 1": x.Fork[1], "fork 3": x.Fork[3],
		} {
			if len(samples) != 1 {
				t.Errorf("%s %s: %d samples, want 1", s.Size.Name, name, len(samples))
			}
			for _, d := range samples {
				if d <= 0 {
					t.Errorf("%s %s: non-positive sample %v", s.Size.Name, name, d)
				}
			}
		}
		if len(x.Resume) == 1 && len(x.ResumeCommand) == 1 && x.ResumeCommand[0] <= x.Resume[0] {
			t.Errorf("%s: resume + command %v not longer than resume %v", s.Size.Name, x.ResumeCommand[0], x.Resume[0])
		}
		if x.MemoryBytes <= 0 || x.ImageBytes <= 0 {
			t.Errorf("%s: memory %d, image %d bytes; want both measured", s.Size.Name, x.MemoryBytes, x.ImageBytes)
		}
	}
	small, dirty := res[0].Samples, res[1].Samples
	if dirty.ImageBytes < small.ImageBytes+16<<20 {
		t.Errorf("dirty image %d bytes, small %d: the 16 MiB are not in it", dirty.ImageBytes, small.ImageBytes)
	}

	left, _ := os.ReadDir(tmp)
	for _, e := range left {
		t.Errorf("left behind in TMPDIR: %s", e.Name())
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), tmp) {
		t.Errorf("mounts left under %s", tmp)
	}
	prefix := fmt.Sprintf("aenv-bench-%d-", os.Getpid())
	cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + prefix + "*")
	for _, c := range cgroups {
		t.Errorf("cgroup left behind: %s", c)
	}
	if p := leftProcesses(t, prefix); len(p) > 0 {
		t.Errorf("processes left behind: %v", p)
	}
}

// leftProcesses lists processes whose command line mentions prefix.
func leftProcesses(t *testing.T, prefix string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), prefix) {
			out = append(out, e.Name()+": "+strings.Join(splitCmdline(b), " "))
		}
	}
	return out
}
