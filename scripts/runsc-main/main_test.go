//go:build aenv_runsc_main

package main

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"slices"
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
	allocs := allocsReader()
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

// TestPrestarted reads the pool's annotation from the spec of the bundle
// the sentry's arguments name, and takes anything else as not prestarted.
func TestPrestarted(t *testing.T) {
	bundle := func(config string) string {
		dir := t.TempDir()
		if config != "" {
			if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	pooled := bundle(`{"ociVersion":"1.0.0","annotations":{"dev.gvisor.spec.rootfs.type":"erofs","dev.aenv.prestarted":"true"}}`)
	for _, tt := range []struct {
		what string
		args []string
		want bool
	}{
		{"a pooled sandbox's spec", []string{"--root=/r", "boot", "--bundle=" + pooled, "--io-fds=4", "id"}, true},
		{"a spec without the annotation", []string{"boot", "--bundle=" + bundle(`{"annotations":{"dev.gvisor.spec.rootfs.type":"erofs"}}`)}, false},
		{"a spec with no annotations", []string{"boot", "--bundle=" + bundle(`{"ociVersion":"1.0.0"}`)}, false},
		{"the annotation not true", []string{"boot", "--bundle=" + bundle(`{"annotations":{"dev.aenv.prestarted":"false"}}`)}, false},
		{"an unreadable spec", []string{"boot", "--bundle=" + bundle(`{"annotations":`)}, false},
		{"no spec", []string{"boot", "--bundle=" + bundle("")}, false},
		{"no bundle", []string{"boot", "id"}, false},
	} {
		if got := prestarted(tt.args); got != tt.want {
			t.Errorf("%s: prestarted = %v, want %v", tt.what, got, tt.want)
		}
	}
}

// TestKeepUntilUsed: a prestarted sentry collects once its boot has gone
// a tick without allocating, not before, and returns at its first use,
// with the count from after its collection; a collection's crumbs are not
// a use.
func TestKeepUntilUsed(t *testing.T) {
	const mib = 1 << 20
	counts := []uint64{
		1 * mib,          // at the start
		9 * mib,          // tick 1: the warm-up
		10 * mib,         // tick 2: the /init
		10 * mib,         // tick 3: quiet: the collection follows
		10*mib + 4<<10,   // after the collection (what it flushed into the count)
		10*mib + 4<<10,   // tick 4: idle in the pool
		10*mib + 12<<10,  // tick 5: Go's forced collection flushing a finalizer's crumbs
		10*mib + 300<<10, // tick 6: the handout's first command
	}
	reads := 0
	read := func() uint64 {
		if reads == len(counts) {
			t.Fatal("read after the use")
		}
		reads++
		return counts[reads-1]
	}
	var collectedAfter []int
	collect := func() { collectedAfter = append(collectedAfter, reads) }
	ticks := make(chan time.Time, 8)
	for range cap(ticks) {
		ticks <- time.Time{}
	}
	close(ticks)
	got := keepUntilUsed(ticks, read, collect)
	if !slices.Equal(collectedAfter, []int{4}) {
		t.Fatalf("collected after reads %v, want once, after the quiet tick's (4)", collectedAfter)
	}
	if left := len(ticks); left != 2 {
		t.Fatalf("returned with %d ticks left, want 2: at the use (tick 6)", left)
	}
	if got != 10*mib+4<<10 {
		t.Fatalf("returned count %d, want %d (after the collection)", got, 10*mib+4<<10)
	}
}

// TestReleaseLoopAtTheUse: a prestarted sentry returns its freed heap
// at the tick that sees its first use, not one tick later, and then as
// any sentry does; one booted at its create never keeps its boot's heap.
func TestReleaseLoopAtTheUse(t *testing.T) {
	const mib = 1 << 20
	counts := []uint64{
		1 * mib,          // at the start
		9 * mib,          // tick 1: the warm-up
		9 * mib,          // tick 2: quiet: the collection follows
		9*mib + 4<<10,    // after the collection
		9*mib + 4<<10,    // tick 3: idle in the pool
		9*mib + 300<<10,  // tick 4: the handout's first command
		9*mib + 300<<10,  // the release's look
		9*mib + 301<<10,  // after the release
		9*mib + 301<<10,  // tick 5: idle
		10*mib + 301<<10, // tick 6: a command
		10*mib + 302<<10, // after the release
	}
	run := func(prestarted bool) (collects, freedAtTicksLeft []int) {
		reads := 0
		read := func() uint64 {
			reads++
			return counts[min(reads, len(counts))-1]
		}
		ticks := make(chan time.Time, 6)
		for range cap(ticks) {
			ticks <- time.Time{}
		}
		close(ticks)
		releaseLoop(ticks, read, prestarted, func() { collects = append(collects, len(ticks)) }, func() { freedAtTicksLeft = append(freedAtTicksLeft, len(ticks)) })
		return collects, freedAtTicksLeft
	}
	collects, freed := run(true)
	if !slices.Equal(collects, []int{4}) {
		t.Errorf("prestarted: collected with %v ticks left, want [4] (at the quiet tick 2)", collects)
	}
	if !slices.Equal(freed, []int{2, 0}) {
		t.Errorf("prestarted: released with %v ticks left, want [2 0] (at the use, tick 4, and the command at tick 6)", freed)
	}
	if collects, _ := run(false); len(collects) != 0 {
		t.Errorf("booted at its create: collected %d times without releasing, want never", len(collects))
	}
}

// TestKeepUntilUsedBusyGuest: a sentry whose guest never stops
// allocating is collected after bootTicks and counts as used at once.
func TestKeepUntilUsedBusyGuest(t *testing.T) {
	var count uint64
	read := func() uint64 {
		count += 1 << 20
		return count
	}
	collects := 0
	ticks := make(chan time.Time, 2*bootTicks)
	for range cap(ticks) {
		ticks <- time.Time{}
	}
	keepUntilUsed(ticks, read, func() { collects++ })
	if collects != 1 {
		t.Fatalf("%d collections, want 1", collects)
	}
	if left := len(ticks); left != bootTicks-1 {
		t.Fatalf("returned with %d ticks left, want %d: collected after bootTicks, used at the next", left, bootTicks-1)
	}
}

func TestNewConfig(t *testing.T) {
	conf, err := newConfig([]string{"--root=/run/x", "--platform=systrap"}, []string{"--overlay2=root:memory"})
	if err != nil {
		t.Fatal(err)
	}
	if conf.RootDir != "/run/x" || conf.Platform != "systrap" || conf.GetOverlay2().String() != "root:memory" {
		t.Errorf("newConfig = root %q, platform %q, overlay2 %q", conf.RootDir, conf.Platform, conf.GetOverlay2())
	}
	if _, err := newConfig([]string{"--root=/run/x", "restore"}, nil); err == nil {
		t.Error("newConfig took a positional argument")
	}
	if _, err := newConfig([]string{"--no-such-flag"}, nil); err == nil {
		t.Error("newConfig took an unknown flag")
	}
}

// TestHandleMissingContainer: a forced delete of what is not there
// succeeds, as `runsc delete --force` does, unless it was meant for
// another runsc root; a restore or checkpoint of it, or an unknown
// request, fails.
func TestHandleMissingContainer(t *testing.T) {
	root := t.TempDir()
	args := []string{"--root=" + root}
	if err := handle(args, serveRequest{Op: "delete", Root: root, ID: "nope"}); err != nil {
		t.Errorf("delete of a missing container: %v", err)
	}
	if err := handle(args, serveRequest{Op: "delete", Root: t.TempDir(), ID: "nope"}); err == nil {
		t.Error("a delete meant for another runsc root succeeded")
	}
	if err := handle(args, serveRequest{Op: "restore", Root: root, ID: "nope", ImagePath: t.TempDir()}); err == nil {
		t.Error("restore of a missing container succeeded")
	}
	if err := handle(args, serveRequest{Op: "checkpoint", Root: root, ID: "nope", ImagePath: t.TempDir()}); err == nil {
		t.Error("checkpoint of a missing container succeeded")
	}
	if err := handle(args, serveRequest{Op: "pause", Root: root, ID: "nope"}); err == nil {
		t.Error("an unknown request succeeded")
	}
}
