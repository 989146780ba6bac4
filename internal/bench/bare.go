package bench

import "time"

// BareResults are the samples of the bare runsc baseline.
type BareResults struct {
	// RunSerial and RunConcurrent are `runsc run /bin/true`, start to exit,
	// one at a time and Concurrency at once.
	RunSerial, RunConcurrent []time.Duration
	// Exec is `runsc exec ID /bin/true` in a running container; ExecShell is
	// `runsc exec ID /bin/bash -l -c true`, the command line aenv's Run uses,
	// so that the two round trips differ only by what aenv adds.
	Exec, ExecShell []time.Duration
	// ExecSpaced is Exec with commandGap before each, as aenv's spaced
	// round trip.
	ExecSpaced []time.Duration
	// Burst is BurstSize `runsc run /bin/true` started at once.
	Burst []time.Duration
	// CPUPerExecShell is the host CPU-seconds one ExecShell sample cost
	// (0: not measured).
	CPUPerExecShell float64
	// CPUPerRun is the host CPU-seconds one `runsc run /bin/true` of the
	// c=1 series cost, its delete included (0: not measured).
	CPUPerRun float64
	// RunsPerSecond is the rate of `runsc run /bin/true` and delete that
	// Concurrency loops kept up for SustainFor.
	RunsPerSecond float64
}

// BareIdle is what count bare runsc sandboxes, each with a sleeping
// python3 as its only process, cost the host.
type BareIdle struct {
	Sandboxes int
	// AvailableDrop is MemAvailable's fall per sandbox, and Cgroup the
	// median of their memory cgroups' usage.
	AvailableDrop, Cgroup int64
	// Available is MemAvailable before they started.
	Available int64
	// CPU is the host CPU one keeps busy while idle, in CPU-seconds per
	// second (IdleResult.CPUPerSandbox's bare counterpart).
	CPU float64
}
