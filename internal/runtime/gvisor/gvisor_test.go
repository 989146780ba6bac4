package gvisor

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/testutil"
)

type fixture struct {
	driver *Driver
	net    *netns.Manager
	rootfs string
	envd   string
}

func setup(t *testing.T) *fixture {
	t.Helper()
	return setupWith(t, "")
}

// setupWith is setup with the driver's systrap fast path set to fp.
func setupWith(t *testing.T, fp FastPath) *fixture {
	t.Helper()
	return setupConfig(t, Config{FastPath: fp})
}

// setupConfig is setup with the driver configured as cfg says, its
// runsc, state directory and cgroup parent aside.
func setupConfig(t *testing.T, cfg Config) *fixture {
	t.Helper()
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	rootfs := os.Getenv("AENV_BASE_ROOTFS")
	bin := os.Getenv("AENV_BIN_DIR")
	if rootfs == "" || bin == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS and AENV_BIN_DIR must be set (make build base)")
	}
	dir := t.TempDir()
	cfg.RunscPath, cfg.StateDir, cfg.CgroupParent = runsc, filepath.Join(dir, "state"), "/aenvgvt"
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := netns.NewManager(context.Background(), netns.Config{
		RunDir: filepath.Join(dir, "netns"), Prefix: netip.MustParsePrefix("10.239.0.0/24"), Tag: "gvt", PoolSize: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })
	return &fixture{driver: d, net: m, rootfs: rootfs, envd: filepath.Join(bin, "envd")}
}

func (f *fixture) spec(t *testing.T, id string) (runtime.Spec, *netns.Slot) {
	slot, err := f.net.Acquire(context.Background(), netns.SlotOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.net.Release(context.Background(), slot) })
	return runtime.Spec{
		ID: id, Root: runtime.RootFS{Dir: f.rootfs}, EnvdPath: f.envd, EnvdPort: 49983,
		NetNSPath: slot.SandboxNSPath, HostAddr: slot.HostAddr,
		CPUCount: 1, MemoryMB: 256,
	}, slot
}

// run runs script in sandbox id with runsc exec and returns its output.
func (f *fixture) run(t *testing.T, id, script string) string {
	t.Helper()
	out, err := exec.Command(f.driver.cfg.RunscPath, "--root", f.driver.runc.Root, "exec", id, "/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", script, err, out)
	}
	return string(out)
}

func waitHealth(t *testing.T, addr netip.Addr) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if answers(addr) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("envd at %s never became healthy", addr)
}

func TestCreateStatsKill(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	spec, slot := f.spec(t, "gvtest1")
	if err := f.driver.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// envd's own line says when it serves: it answers from then on.
	serving := f.driver.EnvdServing("gvtest1")
	if serving == nil {
		t.Fatal("the driver gives no notice of envd serving in a sandbox it booted")
	}
	select {
	case <-serving:
	case <-time.After(10 * time.Second):
		t.Fatal("envd never said it serves")
	}
	if !answers(slot.HostAddr) {
		t.Fatal("envd said it serves but does not answer")
	}

	limit, err := os.ReadFile("/sys/fs/cgroup/memory/aenvgvt/gvtest1/memory.limit_in_bytes")
	if err != nil {
		t.Fatalf("reading the sandbox's memory cgroup: %v", err)
	}
	if strings.TrimSpace(string(limit)) != fmt.Sprint(256<<20) {
		t.Fatalf("memory limit %s, want %d", limit, 256<<20)
	}
	st, err := f.driver.Stats(ctx, "gvtest1")
	if err != nil {
		t.Fatal(err)
	}
	if st.MemoryBytes == 0 || st.CPUUsageNanos == 0 {
		t.Fatalf("stats %+v: want non-zero memory and CPU", st)
	}
	if err := f.driver.Create(ctx, spec); err == nil {
		t.Fatal("creating a second sandbox with the same id succeeded")
	}
	if err := f.driver.Kill(ctx, "gvtest1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.driver.sandboxDir("gvtest1")); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir survived kill: %v", err)
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/aenvgvt/gvtest1"); !os.IsNotExist(err) {
		t.Fatalf("cgroup survived kill: %v", err)
	}
	if err := f.driver.Kill(ctx, "gvtest1"); err == nil {
		t.Fatal("killing twice succeeded")
	}
	if err := f.driver.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFailedCreateLeavesNothing(t *testing.T) {
	f := setup(t)
	spec, _ := f.spec(t, "gvtest2")
	spec.Root.Dir = filepath.Join(t.TempDir(), "missing")
	if err := f.driver.Create(context.Background(), spec); err == nil {
		t.Fatal("create with a missing rootfs succeeded")
	}
	if _, err := os.Stat(f.driver.sandboxDir("gvtest2")); !os.IsNotExist(err) {
		t.Fatalf("failed create left its dir: %v", err)
	}
	list, err := f.driver.runc.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Fatalf("failed create left runsc containers: %v", list)
	}
	if err := f.driver.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDiskBytesFollowsWrites: a sandbox's disk figure is its filestore's
// blocks, read again (through the descriptors found the first time) as
// the sandbox writes files.
func TestDiskBytesFollowsWrites(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	spec, slot := f.spec(t, "gvdisk")
	spec.DiskMB = 256
	if err := f.driver.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	// Close unmounts the namespace runsc exec leaves in the driver's root.
	defer f.driver.Close()
	defer f.driver.Kill(ctx, "gvdisk")
	waitHealth(t, slot.HostAddr)
	disk := func() uint64 {
		t.Helper()
		st, err := f.driver.Stats(ctx, "gvdisk")
		if err != nil {
			t.Fatal(err)
		}
		return st.DiskBytes
	}
	// Not in /tmp, which runsc mounts as a tmpfs of the sandbox's memory.
	before := disk()
	for i := 1; i <= 2; i++ {
		f.run(t, "gvdisk", fmt.Sprintf("dd if=/dev/urandom of=/big%d bs=1M count=32 && sync", i))
		if got := disk(); got < before+uint64(i)*30<<20 {
			t.Fatalf("disk %d bytes after writing %d MiB, was %d", got, i*32, before)
		}
	}
}

// TestStatsLeaveOutInactiveCache: page cache charged to a sandbox that
// the kernel can drop at once (a restore's image, read once) is not
// counted as its memory.
func TestStatsLeaveOutInactiveCache(t *testing.T) {
	f := setup(t)
	ctx := context.Background()
	spec, slot := f.spec(t, "gvcache")
	if err := f.driver.Create(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.driver.Kill(context.Background(), "gvcache")
		f.driver.Close() // unmounts what runsc keeps under the state dir
	})
	waitHealth(t, slot.HostAddr)

	// A file on the disk, out of the page cache.
	const size = 64 << 20
	path := filepath.Join(f.driver.cfg.StateDir, "cache-me")
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	// Dirty pages cannot be dropped: written back first.
	if file, err := os.Open(path); err != nil {
		t.Fatal(err)
	} else if err := errors.Join(file.Sync(), file.Close()); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("dd", "if="+path, "iflag=nocache", "count=0", "status=none").CombinedOutput(); err != nil {
		t.Fatalf("dropping the file from the page cache: %v %s", err, out)
	}
	cg := "/sys/fs/cgroup/memory/aenvgvt/gvcache"
	usage := func() int64 {
		b, err := os.ReadFile(cg + "/memory.usage_in_bytes")
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		fmt.Sscan(string(b), &n)
		return n
	}
	stats := func() int64 {
		st, err := f.driver.Stats(ctx, "gvcache")
		if err != nil {
			t.Fatal(err)
		}
		return int64(st.MemoryBytes)
	}
	u0, s0 := usage(), stats()
	// Read once from within the sandbox's memory cgroup: the cache is
	// charged to it, as a restore's image read is.
	read := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && cat "$2" > /dev/null`, "sh", cg, path)
	if out, err := read.CombinedOutput(); err != nil {
		t.Fatalf("reading the file in the sandbox's cgroup: %v %s", err, out)
	}
	u1, s1 := usage(), stats()
	if u1-u0 < size/2 {
		t.Fatalf("the cgroup's usage grew by %d bytes after reading %d: the read was not charged to it", u1-u0, size)
	}
	if s1-s0 > size/4 {
		t.Fatalf("stats grew by %d bytes (usage by %d) after a %d-byte file was read once: the inactive cache was counted", s1-s0, u1-u0, size)
	}
}
