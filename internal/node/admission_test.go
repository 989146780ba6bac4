package node

import (
	"errors"
	"testing"
)

func TestAdmit(t *testing.T) {
	c := Capacity{MemoryMB: 24576, CPUCount: 2, MemoryOvercommit: 4, MemoryHighWater: 0.9}
	for _, tc := range []struct {
		name            string
		mem, cpus, held int
		used            float64
		want            error
	}{
		{"fits", 512, 2, 0, 0.1, nil},
		{"larger than the node's memory", 32768, 1, 0, 0.1, ErrTooLarge},
		{"more CPUs than the node", 1024, 8, 0, 0.1, ErrTooLarge},
		{"overcommit reached", 16384, 2, 4*24576 - 1000, 0.1, ErrNoCapacity},
		{"just within overcommit", 1000, 2, 4*24576 - 1000, 0.1, nil},
		{"above the high-water mark", 512, 1, 0, 0.95, ErrNoCapacity},
		{"usage unknown", 512, 1, 0, -1, nil},
	} {
		err := c.admit(tc.mem, tc.cpus, tc.held, tc.used)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
			t.Errorf("%s: admit = %v, want %v", tc.name, err, tc.want)
		}
	}
	if d := (Capacity{}).withDefaults(); d.MemoryMB <= 0 || d.CPUCount <= 0 || d.MemoryOvercommit != 4 || d.MemoryHighWater != 0.9 {
		t.Errorf("defaults from the host: %+v", d)
	}
}
