package node

import (
	"errors"
	"math"
	"testing"
)

// TestAdmit: the node applies the shared rule (internal/capacity tests
// its cases) to what it measures, with its size from the host by default.
func TestAdmit(t *testing.T) {
	c := Capacity{MemoryMB: 24576, CPUCount: 2, MemoryOvercommit: 4, MemoryHighWater: 0.9, DiskHighWater: 0.95}
	if err := admit(c, 512, 2, 0, 0.1, -1); err != nil {
		t.Errorf("a sandbox that fits: %v", err)
	}
	if err := admit(c, 32768, 1, 0, 0.1, -1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("larger than the node: %v, want ErrTooLarge", err)
	}
	if err := admit(c, 16384, 2, 4*24576-1000, 0.1, -1); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("past the overcommit: %v, want ErrNoCapacity", err)
	}
	if err := admit(c, 512, 1, 0, 0.1, 0.97); !errors.Is(err, ErrNoCapacity) {
		t.Errorf("the disk nearly full: %v, want ErrNoCapacity", err)
	}
	if d := withHostDefaults(Capacity{}); d.MemoryMB <= 0 || d.CPUCount <= 0 || d.MemoryOvercommit != 4 || d.MemoryHighWater != 0.9 || d.DiskHighWater != 0.95 {
		t.Errorf("defaults from the host: %+v", d)
	}
}

func TestBusyFraction(t *testing.T) {
	for _, tc := range []struct {
		name      string
		prev, now cpuTimes
		running   uint64
		cpus      int
		want      float64
	}{
		{"busy half the time since the last look", cpuTimes{10, 100}, cpuTimes{11, 102}, 1, 2, 0.5},
		{"counters not moved: only the runnable tasks tell", cpuTimes{10, 100}, cpuTimes{10, 100}, 1, 2, 0},
		{"counters not moved in a burst", cpuTimes{10, 100}, cpuTimes{10, 100}, 40, 2, 1},
		{"idle since the last look but tasks queue now", cpuTimes{10, 100}, cpuTimes{10.1, 102}, 3, 2, 1},
		{"one task runs beside the reader on two CPUs", cpuTimes{10, 100}, cpuTimes{10.1, 102}, 2, 2, 0.5},
		{"first look", cpuTimes{}, cpuTimes{10, 100}, 1, 2, 0},
		{"first look in a burst", cpuTimes{}, cpuTimes{10, 100}, 9, 4, 1},
	} {
		if got := busyFraction(tc.prev, tc.now, tc.running, tc.cpus); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("%s: busyFraction = %v, want %v", tc.name, got, tc.want)
		}
	}
}
