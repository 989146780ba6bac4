package bench

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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

func TestAwaitQuiet(t *testing.T) {
	// A host busy for three readings, then quiet: the wait ends at the
	// first quiet one and says how long it took.
	readings := []float64{1.2, 0.9, 0.5, 0.05, 1.5}
	var n int
	busy := func(ctx context.Context, window time.Duration) float64 {
		if window != time.Second {
			t.Errorf("read over %v, want 1s", window)
		}
		n++
		if n == 3 {
			time.Sleep(2100 * time.Millisecond) // past the silent wait
		}
		return readings[n-1]
	}
	var notes strings.Builder
	if got := awaitQuiet(context.Background(), &notes, time.Minute, busy, "the bare runs"); got != 0.05 || n != 4 {
		t.Fatalf("returned %.2f after %d readings, want 0.05 after 4", got, n)
	}
	if !strings.Contains(notes.String(), "for the host to go quiet (the server's warm pool refilling) before the bare runs") {
		t.Errorf("notes %q do not say it waited", notes.String())
	}

	// A host that stays busy: the wait gives up at its bound and says so.
	notes.Reset()
	always := func(context.Context, time.Duration) float64 { time.Sleep(10 * time.Millisecond); return 0.8 }
	if got := awaitQuiet(context.Background(), &notes, 50*time.Millisecond, always, "the bare runs"); got != 0.8 {
		t.Fatalf("returned %.2f, want the last reading 0.8", got)
	}
	if !strings.Contains(notes.String(), "stayed busy (0.80 cores) for 0s; the bare runs went ahead beside that") {
		t.Errorf("notes %q do not say the host stayed busy", notes.String())
	}

	// A quiet host at once: no wait, nothing to say.
	notes.Reset()
	if got := awaitQuiet(context.Background(), &notes, time.Minute, func(context.Context, time.Duration) float64 { return 0.01 }, "the bare runs"); got != 0.01 || notes.Len() != 0 {
		t.Fatalf("a quiet host: returned %.2f, notes %q", got, notes.String())
	}
}
