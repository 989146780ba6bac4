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
}
