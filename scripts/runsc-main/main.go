//go:build aenv_runsc_main

// Command runsc-main is the main package scripts/install-deps.sh builds
// runsc from, in its copy of the gVisor module (with -tags
// aenv_runsc_main): gVisor's runsc (maincli.Main), unchanged but for two
// things. It serves restores, checkpoints and deletes from one
// long-lived process for aenv's driver (serveCommand, serve.go). Its sandbox process (the
// sentry) hands the Go heap it has freed back to the host every
// freeInterval, if it has allocated since it last did
// (releaseIfAllocated); one booted for the warm pool keeps its boot's
// until it is used (keepUntilUsed).
//
// Why: an idle sentry keeps about twice its live Go heap resident (the Go
// runtime scavenges only down to its heap goal), and runsc starts the
// sentry with an empty environment, so GOGC or GOMEMLIMIT cannot reach
// it. Measured with 100 idle sandboxes (python3 asleep, aenv bench --suite
// idle), against the same runsc with its seccomp programs precompiled:
// sentry anon 9.05 -> 8.50 MiB each. The gofer is left alone: its heap is
// small once its seccomp program is precompiled, and a forced collection
// there cost more than it freed (3.30 -> 3.61 MiB). GOMEMLIMIT in runsc's
// environment reaches the gofer and every short-lived runsc command, and
// made creates 2-4x slower.
//
// Why the headroom: a sentry's live heap is a few MiB, so Go's default
// (collect once the heap has doubled) collects every few MiB, and a
// restore, which decodes the whole kernel state into new objects,
// allocates far more than that: it ran several collections in its 100 ms.
// Measured with 15-20 restores of a small sandbox into a prepared one,
// alternating runsc builds that both cut the page reader's parallelism
// (see install-deps), one with a fixed GOGC of 400 standing in for this
// headroom (12 MiB over a 3 MiB heap): host CPU per restore 99 -> 82
// CPU-ms, p50 92 -> 86 ms.
// The cost is at most gcHeadroom of garbage per busy sentry, which the
// next freeInterval returns once it idles. A sentry whose live heap is
// large keeps Go's default.
//
// The build tag keeps it out of the aenv module, which does not depend on
// gVisor.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"time"

	"gvisor.dev/gvisor/runsc/boot"
	"gvisor.dev/gvisor/runsc/cli/maincli"
	"gvisor.dev/gvisor/runsc/version"
)

// freeInterval is how often a sentry that allocated since returns freed
// heap: each time is a full collection (its cost grows with the live heap,
// a few MiB when idle) and a busy sentry takes the released pages back on
// its next allocations.
const freeInterval = 30 * time.Second

// gcHeadroom is the least a sentry's heap grows by between collections.
const gcHeadroom = 16 << 20

// editsCommand, runsc's only argument, prints the edits of
// scripts/runsc-patch.sh this build carries (version.AenvEdits, which
// that script writes), and serveEdit, one per line. A stock runsc
// refuses it as an unknown command: aenv's driver tells the two apart
// with it.
const editsCommand = "aenv-edits"

func main() {
	if len(os.Args) == 2 && os.Args[1] == editsCommand {
		fmt.Println(strings.Join(append(strings.Fields(version.AenvEdits), serveEdit), "\n"))
		return
	}
	if len(os.Args) >= 2 && os.Args[1] == serveCommand {
		if err := serve(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if isSentry(os.Args[1:]) {
		pooled := prestarted(os.Args[1:])
		// Nobody waits on a pooled sandbox's first second; the extra P
		// would cost it heap for good (see scripts/runsc-patch.sh).
		boot.BootExtraP = !pooled
		keepHeadroom()
		go releaseFreedHeap(pooled)
	}
	maincli.Main()
}

// isSentry reports whether args run the sentry ("boot"): runsc starts it
// itself, with every flag as --name=value, so the first argument that is
// not a flag is the subcommand.
func isSentry(args []string) bool {
	for _, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		return a == "boot"
	}
	return false
}

// prestartedAnnotation is aenv's gvisor.PrestartedAnnotation: the spec
// of a sandbox booted for the warm pool carries it.
const prestartedAnnotation = "dev.aenv.prestarted"

// prestarted reports whether the spec in the bundle that args name (as
// --bundle=dir) marks a sandbox booted for the warm pool. It reads the
// file before runsc moves the sentry into its own root; a spec it cannot
// read counts as not prestarted.
func prestarted(args []string) bool {
	var dir string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--bundle="); ok {
			dir = v
		}
	}
	if dir == "" {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return false
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	return json.Unmarshal(b, &spec) == nil && spec.Annotations[prestartedAnnotation] == "true"
}

// releaseFreedHeap runs for the life of the process.
func releaseFreedHeap(prestarted bool) {
	t := time.NewTicker(freeInterval)
	defer t.Stop()
	releaseLoop(t.C, allocsReader(), prestarted, runtime.GC, debug.FreeOSMemory)
}

// releaseLoop releases freed heap at each tick the process allocated
// before (releaseIfAllocated). A prestarted sentry keeps what its boot
// freed until it is used (keepUntilUsed), and releases at the tick that
// saw the use, as a sentry booted at its create releases at the first
// tick after its first command.
//
// Why at that tick: waiting for the next one kept a pooled sandbox's
// boot heap 30 to 60 s past its handout. 10 sandboxes taken from a pool,
// python3 asleep in each, their cgroups' anonymous memory (the sentry's)
// read as they idled: 9.3 MiB (median) until 45 s after the handout, 7.9
// from 60 s; a sentry booted at its create idles at ~7.9.
func releaseLoop(ticks <-chan time.Time, read func() uint64, prestarted bool, collect, free func()) {
	var released uint64
	if prestarted {
		released = releaseIfAllocated(read, keepUntilUsed(ticks, read, collect), free)
	}
	for range ticks {
		released = releaseIfAllocated(read, released, free)
	}
}

// allocsReader returns a reader of the bytes the Go heap has allocated
// in all (/gc/heap/allocs:bytes). Its sample is made once: a reading
// that allocated would itself count as the allocation it looks for.
func allocsReader() func() uint64 {
	allocs := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	return func() uint64 {
		metrics.Read(allocs)
		return allocs[0].Value.Uint64()
	}
}

// keepUntilUsed waits, a tick at a time, for the boot of a prestarted
// sentry (its warm-up and its /init included) to allocate nothing for a
// tick (at most bootTicks), then collects without returning the freed
// heap, then waits for the sandbox's first use (usedBytes allocated),
// and returns the allocation count from before it: releaseIfAllocated
// takes it as a release already made, so the next one follows the use.
//
// Why: a pooled sandbox's first command after its handout faulted back
// in the heap its boot had freed and the first tick had returned.
// Measured with pools of 10 left idle 150 s, then 8 handouts and their
// first command, 2 runs each way alternating (16 each), host CPU of the
// first command (medians): this against the release at the first tick,
// 27.0 -> 24.0 CPU-ms, wall 20.9 -> 19.2 ms, its spread 20-40 -> 19-29
// CPU-ms. (With no release at all, in another sitting: 34.5 -> 26.0.)
// The collection is what lets the next command reuse the garbage's pages
// (without it, it grows into new ones), and it brings the count up to
// date: Go counts a small object once its span leaves its P's cache,
// which a collection makes every span do, so what the boot left in the
// caches would otherwise be counted at Go's next forced collection and
// read as a use.
// The cost, the boot's freed heap kept resident while the sandbox waits
// in the pool, is counted in the pool's memory budget.
func keepUntilUsed(ticks <-chan time.Time, read func() uint64, collect func()) uint64 {
	last := read()
	for i := 0; i < bootTicks; i++ {
		if _, ok := <-ticks; !ok {
			break
		}
		now := read()
		if now == last {
			break
		}
		last = now
	}
	collect()
	kept := read()
	for range ticks {
		if read()-kept >= usedBytes {
			break
		}
	}
	return kept
}

// bootTicks bounds keepUntilUsed's wait for a quiet tick: a guest that
// keeps its sentry busy from its start (a service's own timers) is
// collected then, and counts as used at once, as any sentry would.
const bootTicks = 4

// usedBytes is what a prestarted sentry must allocate in all, after
// keepUntilUsed's collection, to count as used. An idle one's trickle
// (its timers, the guest's runtime) is counted at Go's next forced
// collection, 2 minutes on, and reached it in 2 of 3 sentries watched:
// the boot's heap is then kept about 3 minutes into the pool, and
// released as any sandbox's after. A command (a process started, a
// connection into the sandbox) is far above it.
const usedBytes = 256 << 10

// releaseIfAllocated calls free (a full collection that returns the freed
// heap) unless the process has allocated nothing since the last call
// that freed, when the heap had released bytes allocated in all (read
// is an allocsReader); it returns the count to pass next time.
//
// Why: an idle sentry allocates nothing, so after the first release each
// later one only marked the same live heap again and faulted pages back.
// Measured with 10 idle sandboxes (python3 asleep), 60 s after 45 s of
// rest, alternating builds, 2 runs each: CPU per idle sandbox 0.46-0.70
// -> 0.24-0.26 CPU-ms/s; sentry anon 8.38-8.40 -> 8.10-8.12 MiB.
func releaseIfAllocated(read func() uint64, released uint64, free func()) uint64 {
	if read() == released {
		return released
	}
	free()
	return read()
}

// gcPercent is the GOGC that lets a heap of live bytes grow by at least
// gcHeadroom before the next collection, and never less than Go's
// default 100.
func gcPercent(live uint64) int {
	if live == 0 {
		live = 1 << 20
	}
	return int(max(100, 100*gcHeadroom/live))
}

// keepHeadroom sets GOGC from the live heap now and again after every
// collection. Go has no hook at the end of a collection; a finalizer on an
// object only this function references runs after the cycle that found
// it unreachable, and re-arms itself with a new one.
func keepHeadroom() {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	last := -1
	adjust := func() {
		metrics.Read(sample)
		var live uint64
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live = sample[0].Value.Uint64()
		}
		if p := gcPercent(live); p != last {
			debug.SetGCPercent(p)
			last = p
		}
	}
	var arm func()
	arm = func() {
		// A pointer field keeps the object out of Go's tiny allocator,
		// whose blocks may never be freed (and so never finalized).
		runtime.SetFinalizer(&struct{ _ *byte }{}, func(*struct{ _ *byte }) {
			adjust()
			arm()
		})
	}
	adjust()
	arm()
}
