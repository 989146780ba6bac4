package build

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/runtime/gvisor"
	"github.com/aenvhq/aenv/internal/template"
)

func TestSlots(t *testing.T) {
	s := NewSlots(2)
	var log bytes.Buffer
	r1, _ := s.Acquire(context.Background(), &log)
	r2, _ := s.Acquire(context.Background(), &log)
	if log.Len() != 0 {
		t.Fatalf("builds with room logged %q", log.String())
	}
	got := make(chan struct{})
	var third bytes.Buffer
	go func() {
		r3, err := s.Acquire(context.Background(), &third)
		if err == nil {
			r3()
		}
		close(got)
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("a third build ran beside two")
	default:
	}
	// A fourth waits behind the third, and gives up with its context.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var fourth bytes.Buffer
	if _, err := s.Acquire(ctx, &fourth); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting past the context: %v", err)
	}
	if !strings.Contains(fourth.String(), "queued: 3 builds ahead") {
		t.Fatalf("the fourth build's log: %q", fourth.String())
	}
	r1()
	<-got
	if !strings.Contains(third.String(), "queued: 2 builds ahead") || !strings.Contains(third.String(), "starting after") {
		t.Fatalf("the third build's log: %q", third.String())
	}
	r2()
	var nilSlots *Slots
	if r, err := nilSlots.Acquire(context.Background(), &log); err != nil || log.Len() != 0 {
		t.Fatalf("nil Slots: %v %q", err, log.String())
	} else {
		r()
	}
}

func TestBoundStrings(t *testing.T) {
	for d, want := range map[time.Duration]string{
		30 * time.Minute: "30m", time.Hour: "1h", 90 * time.Minute: "1h30m", 8 * time.Second: "8s",
		1500 * time.Millisecond: "2s", 250 * time.Millisecond: "250ms",
	} {
		if got := shortDuration(d); got != want {
			t.Errorf("shortDuration(%s) = %q, want %q", d, got, want)
		}
	}
	for n, want := range map[int64]string{20 << 30: "20 GiB", 64 << 20: "64 MiB", 1536 << 20: "1536 MiB", 100: "100 bytes"} {
		if got := diskString(n); got != want {
			t.Errorf("diskString(%d) = %q, want %q", n, got, want)
		}
	}
}

// allocated is the disk space the files under dir take.
func allocated(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	return n
}

// TestBuildBounds runs builds past each bound of Limits, over a busybox
// image, and checks they fail for that reason and leave nothing behind.
func TestBuildBounds(t *testing.T) {
	store, host := testStore(t)
	from := "FROM oci:" + busyboxLayout(t) + ":v1\n"
	disks := t.TempDir()
	build := func(t *testing.T, id, steps string, lim Limits) (time.Duration, string, error) {
		t.Helper()
		df, err := Parse(strings.NewReader(from + steps))
		if err != nil {
			t.Fatal(err)
		}
		lim.DiskDir = disks
		var log bytes.Buffer
		start := time.Now()
		_, err = Run(context.Background(), df, Options{Steps: host, Store: store, Template: template.Template{ID: id}, Limits: lim, Log: &log})
		took := time.Since(start)
		if err != nil {
			if _, gone := store.Get(id); gone == nil {
				t.Error("a failed build left its template")
			}
		}
		if left, _ := os.ReadDir(disks); len(left) != 0 {
			t.Errorf("build disks left: %v", left)
		}
		if left := host.leftovers(t); len(left) != 0 {
			t.Errorf("build state left: %v", left)
		}
		return took, log.String(), err
	}

	t.Run("disk", func(t *testing.T) {
		before := allocated(t, store.Dir())
		// count bounds the harm should the bound not hold.
		_, log, err := build(t, "fills-disk", "RUN dd if=/dev/zero of=/f bs=1M count=256\n", Limits{DiskBytes: 64 << 20})
		var se *StepError
		if !errors.As(err, &se) || se.Step != 1 || !errors.Is(err, ErrDiskFull) ||
			!strings.Contains(err.Error(), "no space left on the build disk (64 MiB)") {
			t.Fatalf("err = %v\nlog:\n%s", err, log)
		}
		if grew := allocated(t, store.Dir()) - before; grew > 4<<20 {
			t.Fatalf("the template store grew by %d bytes", grew)
		}
	})
	t.Run("memory", func(t *testing.T) {
		_, log, err := build(t, "eats-memory", "RUN dd if=/dev/zero of=/dev/null bs=1G count=1\n", Limits{MemoryMB: 128})
		if !errors.Is(err, ErrOutOfMemory) || !strings.Contains(err.Error(), "killed: out of memory (128 MiB)") {
			t.Fatalf("err = %v\nlog:\n%s", err, log)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		took, log, err := build(t, "sleeps", "RUN sleep 60\n", Limits{Timeout: 3 * time.Second})
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "timed out after 3s") {
			t.Fatalf("err = %v\nlog:\n%s", err, log)
		}
		if took > 20*time.Second {
			t.Fatalf("a 3s time limit took %s to end the build", took)
		}
	})
	t.Run("within", func(t *testing.T) {
		// The bounds reach the step, as host cgroups (read while it runs)
		// and RLIMIT_NPROC, and a build within them is copied off its disk
		// into the store.
		want := map[string]string{"cpu.cfs_quota_us": "100000", "memory.limit_in_bytes": strconv.Itoa(256 << 20), "pids.max": strconv.Itoa(77 + gvisor.HostPidsOverhead)}
		seen := make(chan map[string]string, 1)
		go func() {
			// The files read as the kernel's defaults between the
			// cgroup's creation and its limits' writes (seen under load):
			// they are read until they match or the step is long done.
			got := map[string]string{}
			for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline) && fmt.Sprint(got) != fmt.Sprint(want); time.Sleep(50 * time.Millisecond) {
				for _, f := range []string{"cpu/aenv/step-*/cpu.cfs_quota_us", "memory/aenv/step-*/memory.limit_in_bytes", "pids/aenv/step-*/pids.max"} {
					if m, _ := filepath.Glob("/sys/fs/cgroup/" + f); len(m) == 1 {
						if b, err := os.ReadFile(m[0]); err == nil {
							got[filepath.Base(f)] = strings.TrimSpace(string(b))
						}
					}
				}
			}
			seen <- got
		}()
		// Each guest user gets two fifths of the limit: gVisor runs two
		// host processes per guest one, and keeps them a while.
		_, log, err := build(t, "fits", `RUN test "$(ulimit -u)" = 30 && echo made > /made && sleep 2`+"\n",
			Limits{MemoryMB: 256, CPUCount: 1, PidsLimit: 77, DiskBytes: 64 << 20, Timeout: time.Minute})
		if err != nil {
			t.Fatalf("build: %v\nlog:\n%s", err, log)
		}
		if got := <-seen; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("the step's cgroups: %v, want %v", got, want)
		}
		tpl, err := store.Get("fits")
		if err != nil {
			t.Fatal(err)
		}
		if b, err := os.ReadFile(filepath.Join(tpl.RootFS, "made")); err != nil || string(b) != "made\n" {
			t.Fatalf("made = %q, %v", b, err)
		}
	})
}
