package node

import (
	"errors"
	"testing"
)

func TestAdmit(t *testing.T) {
	c := Capacity{MemoryMB: 24576, CPUCount: 2, MemoryOvercommit: 4, MemoryHighWater: 0.9, DiskHighWater: 0.95}
	for _, tc := range []struct {
		name            string
		mem, cpus, held int
		used            float64
		want            error
		disk            float64
	}{
		{"fits", 512, 2, 0, 0.1, nil, -1},
		{"larger than the node's memory", 32768, 1, 0, 0.1, ErrTooLarge, -1},
		{"more CPUs than the node", 1024, 8, 0, 0.1, ErrTooLarge, -1},
		{"overcommit reached", 16384, 2, 4*24576 - 1000, 0.1, ErrNoCapacity, -1},
		{"just within overcommit", 1000, 2, 4*24576 - 1000, 0.1, nil, -1},
		{"above the high-water mark", 512, 1, 0, 0.95, ErrNoCapacity, -1},
		{"usage unknown", 512, 1, 0, -1, nil, -1},
		{"the disk nearly full", 512, 1, 0, 0.1, ErrNoCapacity, 0.97},
		{"the disk fine", 512, 1, 0, 0.1, nil, 0.5},
	} {
		err := c.admit(tc.mem, tc.cpus, tc.held, tc.used, tc.disk)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: admit = %v, want %v", tc.name, err, tc.want)
		}
	}
	if d := (Capacity{}).withDefaults(); d.MemoryMB <= 0 || d.CPUCount <= 0 || d.MemoryOvercommit != 4 || d.MemoryHighWater != 0.9 || d.DiskHighWater != 0.95 {
		t.Errorf("defaults from the host: %+v", d)
	}
}
