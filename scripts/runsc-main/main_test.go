//go:build aenv_runsc_main

package main

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func TestIsSentry(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{[]string{"--root=/run/x", "--platform=systrap", "boot", "--bundle=/b", "id"}, true},
		{[]string{"--root=/run/x", "gofer", "--bundle=/b"}, false},
		{[]string{"--root=/run/x", "create", "--bundle", "/b", "boot"}, false},
		{[]string{"--version"}, false},
		{nil, false},
	} {
		if got := isSentry(tt.args); got != tt.want {
			t.Errorf("isSentry(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}

func TestGCPercent(t *testing.T) {
	for _, tt := range []struct {
		live uint64
		want int
	}{
		{0, 1600},
		{2 << 20, 800},
		{4 << 20, 400},
		{16 << 20, 100},
		{200 << 20, 100},
	} {
		if got := gcPercent(tt.live); got != tt.want {
			t.Errorf("gcPercent(%d) = %d, want %d", tt.live, got, tt.want)
		}
	}
}

// TestKeepHeadroom checks the percent follows the live heap across
// collections: set from a small heap, back to 100 once the live heap
// passes gcHeadroom.
func TestKeepHeadroom(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	keepHeadroom()
	if p := gogc(); p <= 100 {
		t.Fatalf("GOGC with a small heap = %d, want above 100", p)
	}
	big := make([][]byte, 64)
	for i := range big {
		big[i] = make([]byte, 1<<20)
	}
	waitGOGC(t, func(p int) bool { return p == 100 })
	runtime.KeepAlive(big)
	big = nil
	waitGOGC(t, func(p int) bool { return p > 100 })
}

func waitGOGC(t *testing.T, ok func(int) bool) {
	t.Helper()
	for range 50 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // the finalizer runs on its own goroutine
		if ok(gogc()) {
			return
		}
	}
	t.Fatalf("GOGC stayed %d", gogc())
}

func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}

// TestReleaseIfAllocated: the heap is released after allocations, and not
// again while nothing is allocated (retried: the test binary's own
// goroutines may allocate between two calls).
func TestReleaseIfAllocated(t *testing.T) {
	allocs := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	frees := 0
	free := func() { frees++ }
	released := releaseIfAllocated(allocs, 0, free)
	if frees != 1 || released == 0 {
		t.Fatalf("first call: %d frees, released at %d bytes, want 1 free", frees, released)
	}
	skipped := false
	for range 10 {
		before := frees
		released = releaseIfAllocated(allocs, released, free)
		if frees == before {
			skipped = true
			break
		}
	}
	if !skipped {
		t.Fatal("released again every time though nothing was allocated")
	}
	sink = make([]byte, 1<<20)
	before := frees
	if releaseIfAllocated(allocs, released, free); frees != before+1 {
		t.Fatal("not released after an allocation of 1 MiB")
	}
}

// sink keeps the test's allocation from being optimised away.
var sink []byte
