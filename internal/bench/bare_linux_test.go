package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/runtime/gvisor"
	"github.com/aenvhq/aenv/internal/testutil"
)

// bareEnv is what the bare baseline's tests need: root, runsc and the
// base root filesystem.
func bareEnv(t *testing.T) (runsc, rootfs string) {
	t.Helper()
	testutil.RequireRoot(t)
	runsc = testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	if rootfs = os.Getenv("AENV_BASE_ROOTFS"); rootfs == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS is not set")
	}
	return runsc, rootfs
}

func TestMeasureBare(t *testing.T) {
	runsc, rootfs := bareEnv(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // to see that the runsc root is removed

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := MeasureBare(ctx, Options{
		Iterations: 2, Concurrency: 2,
		RunscPath: runsc, RootFS: rootfs,
		CPUCount: 2, MemoryMB: 512,
		BurstSize: 3, SustainFor: time.Second,
		quietWithin: time.Second, // the suite may run beside other packages
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string][]time.Duration{
		"run c=1": res.RunSerial, "run c=2": res.RunConcurrent,
		"exec": res.Exec, "exec bash": res.ExecShell, "burst": res.Burst,
	} {
		if want := map[bool]int{true: 3, false: 2}[name == "burst"]; len(s) != want {
			t.Errorf("%s: %d samples, want %d", name, len(s), want)
		}
		for _, d := range s {
			if d <= 0 {
				t.Errorf("%s: non-positive sample %v", name, d)
			}
		}
	}

	// A runsc run takes well under a second here: a second of two loops
	// does at least one; each costs some CPU.
	if res.RunsPerSecond < 1 || res.CPUPerRun <= 0 || res.CPUPerExecShell <= 0 {
		t.Errorf("sustained %.1f runs/s, %.3f CPU-s per run, %.3f per exec of bash; want >= 1, > 0 and > 0",
			res.RunsPerSecond, res.CPUPerRun, res.CPUPerExecShell)
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
	cgroups, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/aenv-bench-%d-*", os.Getpid()))
	for _, c := range cgroups {
		t.Errorf("cgroup left behind: %s", c)
	}
}

func TestCheckBareRejectsMissingRootFS(t *testing.T) {
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	if err := CheckBare(Options{RunscPath: runsc, RootFS: t.TempDir()}); err == nil {
		t.Error("CheckBare accepted a root filesystem without /bin/true")
	}
}

// TestMeasureBareIdleAndWall: bare idle sandboxes cost memory and are all
// deleted; a bare wall of three runs gives one sample a round.
func TestMeasureBareIdleAndWall(t *testing.T) {
	runsc, rootfs := bareEnv(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opts := Options{RunscPath: runsc, RootFS: rootfs, CPUCount: 1, MemoryMB: 256, quietWithin: time.Second}
	idle, err := MeasureBareIdle(ctx, opts, 3, 3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A sentry with a python3 in it holds megabytes, not bytes.
	if idle.Sandboxes != 3 || idle.Cgroup < 1<<20 || idle.Available <= 0 {
		t.Errorf("bare idle %+v: want 3 sandboxes with a cgroup of at least 1 MiB each", idle)
	}
	wall, err := MeasureBareWall(ctx, opts, 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(wall) != 2 || wall[0] <= 0 || wall[1] <= 0 {
		t.Errorf("bare wall samples %v, want 2 positive", wall)
	}
	left, _ := os.ReadDir(tmp)
	for _, e := range left {
		t.Errorf("left behind in TMPDIR: %s", e.Name())
	}
	cgroups, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/*/aenv-bench-%d-*", os.Getpid()))
	for _, c := range cgroups {
		t.Errorf("cgroup left behind: %s", c)
	}
}

// TestBareIDsAreNoPrefixes: no container id is a prefix of another,
// which runsc would refuse as ambiguous.
func TestBareIDsAreNoPrefixes(t *testing.T) {
	r := &bareRunner{prefix: "aenv-bench-1-"}
	var ids []string
	for range 1200 {
		ids = append(ids, r.nextID())
	}
	for i, a := range ids {
		for j, b := range ids {
			if i != j && strings.HasPrefix(b, a) {
				t.Fatalf("%s is a prefix of %s", a, b)
			}
		}
	}
}

// TestBareArgsFollowTheServersFastPath: the bare baseline runs runsc with
// the fast path setting the server was given, and CheckBare refuses one
// that is not auto, on or off.
func TestBareArgsFollowTheServersFastPath(t *testing.T) {
	const flag = "--systrap-disable-fast-path"
	for fp, want := range map[gvisor.FastPath]bool{gvisor.FastPathOff: true, gvisor.FastPathOn: false} {
		r := &bareRunner{fastPath: fp}
		if got := slices.Contains(r.args("run", "x"), flag); got != want {
			t.Errorf("fast path %s: args %v", fp, r.args("run", "x"))
		}
	}
	if err := CheckBare(Options{FastPath: "sometimes"}); err == nil || os.Geteuid() == 0 && !strings.Contains(err.Error(), "auto, on or off") {
		t.Errorf("CheckBare with fast path sometimes: %v", err)
	}
}

// TestMeasureBareRelativePaths: the root filesystem and envd given
// relative to the working directory (`aenv bench --envd bin/envd`) reach
// the bare sandboxes, whose runsc would read them from the bundle's
// directory.
func TestMeasureBareRelativePaths(t *testing.T) {
	runsc, rootfs := bareEnv(t)
	wd := t.TempDir()
	t.Chdir(wd)
	if err := os.MkdirAll("bin", 0o755); err != nil {
		t.Fatal(err)
	}
	// Only mounted: the runs time /bin/true, not envd.
	if err := os.WriteFile("bin/envd", []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	relRoot, err := filepath.Rel(wd, rootfs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := MeasureBare(ctx, Options{
		Iterations: 1, Concurrency: 1, RunscPath: runsc, RootFS: relRoot, EnvdPath: "bin/envd",
		CPUCount: 1, MemoryMB: 256, quietWithin: time.Second,
	})
	if err != nil {
		t.Fatalf("bare runs with relative paths: %v", err)
	}
	if len(res.RunSerial) != 1 {
		t.Errorf("run c=1: %d samples, want 1", len(res.RunSerial))
	}
}
