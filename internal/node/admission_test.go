package node

import (
	"errors"
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
