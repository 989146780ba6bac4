package bench

import (
	"math"
	"os"
	"path/filepath"
	"testing"
)

// TestHostCPUSeconds: busy time is every counter of the cpu line but idle,
// iowait and the guest counters (already in user), in USER_HZ.
func TestHostCPUSeconds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  1000 50 300 9999 77 10 20 5 400 7\ncpu0 1 2 3 4 5 6 7 8 9 10\nintr 1\n"
	if err := os.WriteFile(path, []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := hostCPUSeconds(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := (1000 + 50 + 300 + 10 + 20 + 5) / 100.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("busy = %v s, want %v", got, want)
	}
	if err := os.WriteFile(path, []byte("intr 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := hostCPUSeconds(path); err == nil {
		t.Error("a stat file without a cpu line read as a figure, want an error")
	}
	if _, err := hostCPUSeconds(path + ".missing"); err == nil {
		t.Error("a missing stat file read as a figure, want an error")
	}
}

// TestMedianOf: the nearest-rank median, the lower middle for an even
// count, 0 for nothing measured.
func TestMedianOf(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2}} {
		if got := medianOf(c.in); got != c.want {
			t.Errorf("medianOf(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
