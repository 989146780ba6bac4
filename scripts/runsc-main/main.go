//go:build aenv_runsc_main

// Command runsc-main is the main package scripts/install-deps.sh builds
// runsc from, in its copy of the gVisor module (with -tags
// aenv_runsc_main): gVisor's runsc (maincli.Main), unchanged but for one
// thing. Its sandbox process (the sentry) hands the Go heap it has freed
// back to the host every freeInterval.
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
// The build tag keeps it out of the aenv module, which does not depend on
// gVisor.
package main

import (
	"os"
	"runtime/debug"
	"strings"
	"time"

	"gvisor.dev/gvisor/runsc/cli/maincli"
)

// freeInterval is how often a sentry returns freed heap: each time is a
// full collection (its cost grows with the live heap, a few MiB when idle)
// and a busy sentry takes the released pages back on its next allocations.
const freeInterval = 30 * time.Second

func main() {
	if isSentry(os.Args[1:]) {
		go releaseFreedHeap()
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

// releaseFreedHeap runs for the life of the process.
func releaseFreedHeap() {
	t := time.NewTicker(freeInterval)
	defer t.Stop()
	for range t.C {
		debug.FreeOSMemory()
	}
}
