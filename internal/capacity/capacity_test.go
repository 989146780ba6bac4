package capacity

import (
	"errors"
	"strings"
	"testing"
)

func TestAdmit(t *testing.T) {
	r := Rule{MemoryMB: 24576, CPUCount: 2, MemoryOvercommit: 4, MemoryHighWater: 0.9, DiskHighWater: 0.95}
	for _, tc := range []struct {
		name            string
		mem, cpus, held int
		used, disk      float64
		verdict         Verdict
		want            error
		says            string
	}{
		{"fits", 512, 2, 0, 0.1, -1, Fits, nil, ""},
		{"larger than the node's memory", 32768, 1, 0, 0.1, -1, TooLarge, ErrTooLarge, "exceeds the node's 24576 MiB"},
		{"more CPUs than the node", 1024, 8, 0, 0.1, -1, TooLarge, ErrTooLarge, "exceeds the node's 2 CPUs"},
		{"overcommit reached", 16384, 2, 4*24576 - 1000, 0.1, -1, OverCommitted, ErrNoCapacity, "of the 98304 MiB the node may commit"},
		{"just within overcommit", 1000, 2, 4*24576 - 1000, 0.1, -1, Fits, nil, ""},
		{"above the high-water mark", 512, 1, 0, 0.95, -1, MemoryHot, ErrNoCapacity, "95% used"},
		{"usage unknown", 512, 1, 0, -1, -1, Fits, nil, ""},
		{"the disk nearly full", 512, 1, 0, 0.1, 0.97, DiskFull, ErrNoCapacity, "97% full"},
		{"the disk fine", 512, 1, 0, 0.1, 0.5, Fits, nil, ""},
		{"too large wins over full", 32768, 1, 4 * 24576, 0.99, 0.99, TooLarge, ErrTooLarge, ""},
	} {
		req, l := Request{MemoryMB: tc.mem, CPUs: tc.cpus}, Load{CommittedMB: tc.held, MemoryUsed: tc.used, DiskUsed: tc.disk}
		if v := r.Check(req, l); v != tc.verdict {
			t.Errorf("%s: Check = %d, want %d", tc.name, v, tc.verdict)
		}
		err := r.Admit(req, l)
		if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) || err != nil && !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: Admit = %v, want %v saying %q", tc.name, err, tc.want, tc.says)
		}
	}
	if h := r.HeadroomMB(Request{MemoryMB: 1000}, Load{CommittedMB: 4*24576 - 1000}); h != 0 {
		t.Errorf("headroom of the last MiB: %d, want 0", h)
	}
}

func TestDefaults(t *testing.T) {
	d := Rule{MemoryMB: 1024}.WithDefaults()
	if d.MemoryMB != 1024 || d.MemoryOvercommit != 4 || d.MemoryHighWater != 0.9 || d.DiskHighWater != 0.95 {
		t.Errorf("defaults: %+v", d)
	}
	if d.CommitLimitMB() != 4096 {
		t.Errorf("commit limit of 1024 MiB at 4x: %d", d.CommitLimitMB())
	}
	// A fraction above 1 would never refuse: it is taken for unset.
	if d := (Rule{MemoryHighWater: 1.5, DiskHighWater: 2, MemoryOvercommit: 1.5}).WithDefaults(); d.MemoryHighWater != 0.9 || d.DiskHighWater != 0.95 || d.MemoryOvercommit != 1.5 {
		t.Errorf("out-of-range fractions: %+v", d)
	}
}

func TestRestorable(t *testing.T) {
	for _, tc := range []struct {
		saved, running string
		want           bool
	}{
		{"v1", "v1", true},
		{"v1", "v2", false},
		{"", "v2", true},
		{UnstampedVersion, "v2", true},
		{"v2", UnstampedVersion, false},
	} {
		if got := Restorable(tc.saved, tc.running); got != tc.want {
			t.Errorf("Restorable(%q, %q) = %v, want %v", tc.saved, tc.running, got, tc.want)
		}
	}
}
