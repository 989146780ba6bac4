#!/usr/bin/env bash
# Edits the copy of the gVisor module in $1 before scripts/install-deps.sh
# builds runsc from it. Each edit checks it applied, so that a new gVisor
# release that moved the code fails the build here rather than quietly
# dropping the edit.
set -euo pipefail
src=$1

# missing fails the build: what was not found, and where.
missing() {
  echo "runsc-patch: $1 was not found in ${*:2}" >&2
  exit 1
}

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
{ grep -q '4\*runtime.GOMAXPROCS(0)' "$pf" && [ "$(grep -c '^	"runtime"$' "$pf")" = 1 ]; } ||
  missing "the pages reader's parallelism" "$pf"

# A root filesystem given as an EROFS image (the dev.gvisor.spec.rootfs
# annotations) with no bind mounts runs without a gofer process, but
# gVisor then gives the root's overlay no filestore: its writes land in
# the sandbox's memory whatever --overlay2 says. Two edits create the
# filestore there too (in --overlay2's directory, opened through / since
# there is no gofer's mount namespace to open it through), so that a
# goferless sandbox's files take disk, as a gofer-backed one's do.
ct=$src/runsc/container/container.go
perl -0pi -e 's|(\tgoferRootfs := fmt.Sprintf\("/proc/%d/root", c.GoferPid.Load\(\)\)\n)|$1\tif c.GoferPid.Load() == 0 {\n\t\tgoferRootfs = "/"\n\t}\n|' "$ct"
perl -0pi -e 's|\t\tcu.Release\(\)\n\t\treturn ioFiles, nil, nil, nil, nil\n|\t\tfilestores, err := c.createGoferFilestores(conf.GetOverlay2(), mountHints)\n\t\tif err != nil {\n\t\t\treturn nil, nil, nil, nil, err\n\t\t}\n\t\tcu.Release()\n\t\treturn ioFiles, filestores, nil, nil, nil\n|' "$ct"
{ grep -q 'goferRootfs = "/"' "$ct" && grep -q 'return ioFiles, filestores, nil, nil, nil' "$ct"; } ||
  missing "the goferless root's filestore code" "$ct"
# What aenv's driver asks a runsc for (`runsc aenv-edits`, served by
# scripts/runsc-main) before it runs sandboxes without a gofer: a stock
# runsc would keep their writes in memory, silently.
cat > "$src/runsc/version/aenv_edits.go" <<'GO'
package version

// AenvEdits names the edits of aenv's scripts/runsc-patch.sh that aenv
// relies on, separated by spaces.
const AenvEdits = "goferless-filestore"
GO

# A restore checks that the gVisor annotations of the new spec match the
# checkpoint's, sources of mounts excepted (a restore on another host or
# under another sandbox's name finds its files elsewhere). The root's
# image is such a source: its path is the host's, not the snapshot's.
rs=$src/runsc/specutils/restore.go
perl -0pi -e 's|(\tif strings.HasPrefix\(key, mntPrefix\) && strings.HasSuffix\(key, ".source"\) \{\n\t\treturn false\n\t\}\n)|$1\tif key == "dev.gvisor.spec.rootfs.source" {\n\t\treturn false\n\t}\n|' "$rs"
grep -q 'key == "dev.gvisor.spec.rootfs.source"' "$rs" ||
  missing "the restore's annotation check" "$rs"

# A restored sandbox left its first request waiting 10-18 ms. The sentry
# runs with as many Go Ps as the sandbox has CPUs (2 here). As a restore
# starts the kernel, both are held by goroutines blocked in host syscalls
# (the NIC's receive poll, the control RPC's), so the restored tasks and
# the network's goroutines wait for Go's sysmon to hand a P off, and
# sysmon, idle since the sandbox was prepared, sleeps 10 ms between
# looks. One more P for the restore's first second lets them run at once.
# Measured with pause/resume of a small sandbox on this 2-CPU host: first
# connection to envd 10-18 -> 1-3 ms; resume p50 at the API right after
# its pause 90 -> 71-77 ms, in `aenv bench --suite snapshot` 98-102 ->
# 85-87 ms (alternating builds). A permanent extra P did the same but
# cost 0.3 MiB per idle sandbox.
rr=$src/runsc/boot/restore.go
perl -0pi -e 's|(\n\tr.timer.Reached\("Starting sandbox"\)\n)|\n\tgomaxprocs.Add(1)\n\ttime2.AfterFunc(time2.Second, func() { gomaxprocs.Add(-1) })$1|' "$rr"
perl -0pi -e 's|(\n\t"gvisor.dev/gvisor/pkg/fd"\n)|$1\t"gvisor.dev/gvisor/pkg/gomaxprocs"\n|' "$rr"
{ grep -q 'gomaxprocs.Add(1)' "$rr" && grep -q '"gvisor.dev/gvisor/pkg/gomaxprocs"' "$rr"; } ||
  missing "the restore's kernel start" "$rr"

# A booted sandbox's first requests waited the same way: envd, the ready
# shell it starts and the guest's first process hold both Ps as envd
# begins to serve, and the NIC's goroutine, back from its host read with a
# packet, waits for one. The same extra P for the boot's first second,
# unless the sandbox is booted for the warm pool: nobody waits on its
# first second, and a sentry that ran it with 3 Ps keeps ~0.6 MiB more
# for good, which neither a collection nor a scavenge returns (30 idle
# sandboxes, builds alternating: sentry anon 7.32 -> 7.89-7.94 MiB booted
# at the create; taken from the pool, 9.84 MiB with the extra P and 9.20
# without). aenv's runsc main clears BootExtraP for those.
lr=$src/runsc/boot/loader.go
perl -0pi -e 's|(\n\tlog.Infof\("Process should have started..."\)\n)|$1\tif l.state == created \&\& BootExtraP {\n\t\tgomaxprocs.Add(1)\n\t\tgtime.AfterFunc(gtime.Second, func() { gomaxprocs.Add(-1) })\n\t}\n|' "$lr"
cat > "$src/runsc/boot/aenv_bootp.go" <<'GO'
package boot

// BootExtraP gives a booted sentry one more Go P for its first second
// (aenv's scripts/runsc-patch.sh); aenv's runsc main clears it for a
// sandbox booted for the warm pool.
var BootExtraP = true
GO
{ grep -q 'l.state == created && BootExtraP' "$lr" && grep -q '^	gtime "time"$' "$lr" && grep -q '^	"gvisor.dev/gvisor/pkg/gomaxprocs"$' "$lr"; } ||
  missing "the boot's kernel start" "$lr"

# The sentry builds the descriptions of its ~400 trace points (a map of
# fields per system call) at every boot and restore, for trace sessions
# that aenv never configures: ~8 ms of a boot's ~50 CPU-ms in the sentry
# (a profile of 10 creates on this 2-CPU host), on the boot's critical
# path, and the maps stay in the heap of every idle sandbox. They are
# built instead when a session first asks for a point by name
# (findPointDesc: a session's creation, at boot or through `runsc
# trace`); whether a point is enabled never needed them. Measured with
# 15 creates without a pool, 5 runs per build alternating: create p50
# 119 -> 109 ms; host CPU per create and kill within noise (192 -> 191).
ld=$src/runsc/boot/loader.go
sc=$src/pkg/sentry/seccheck/config.go
perl -0pi -e 's|\n\t// Initialize seccheck points.\n\tseccheck.Initialize\(\)\n(\targs.StartupTimer.Reached\("seccheck initialized"\)\n)|\n$1|' "$ld"
perl -0pi -e 's|(\nfunc findPointDesc\(name string\) \(PointDesc, error\) \{\n)|$1\tInitialize()\n|' "$sc"
{ ! grep -q 'seccheck.Initialize()' "$ld" && grep -Pzq 'func findPointDesc\(name string\) \(PointDesc, error\) \{\n\tInitialize\(\)' "$sc"; } ||
  missing "seccheck's initialisation" "$ld" "$sc"
