#!/usr/bin/env bash
# Edits the copy of the gVisor module in $1 before scripts/install-deps.sh
# builds runsc from it. Each edit checks it applied, so that a new gVisor
# release that moved the code fails the build here rather than quietly
# dropping the edit.
set -euo pipefail
src=$1

# The sentry reads a snapshot's pages with up to 128 reads at once, and
# raises GOMAXPROCS by as many for the length of the load (a stop of the
# world each way, and the collector's share of 130 Ps on a 2-CPU host).
# Four per CPU of the sandbox keep a disk busy enough. (Checkpoints write
# through Linux AIO, without goroutines: their writer is left alone.) Measured with 15-20
# restores of a small sandbox into a prepared one, alternating builds on
# this 2-CPU host: p50 97 -> 92 ms, 106 -> 99 host CPU-ms each.
pf=$src/pkg/sentry/state/stateio/pagesfile.go
sed -i -e '/^func NewPagesFileFDReaderDefault(/,/^}/ s/pagesFileFDDefaultMaxIOBytes, pagesFileFDDefaultMaxParallel)$/pagesFileFDDefaultMaxIOBytes, min(pagesFileFDDefaultMaxParallel, 4*runtime.GOMAXPROCS(0)))/' \
  -e 's|^\t"gvisor.dev/gvisor/pkg/hostarch"$|\t"runtime"\n\n&|' "$pf"
if ! grep -q '4\*runtime.GOMAXPROCS(0)' "$pf" || [ "$(grep -c '^	"runtime"$' "$pf")" != 1 ]; then
  echo "runsc-patch: the pages reader's parallelism was not found in $pf" >&2
  exit 1
fi
