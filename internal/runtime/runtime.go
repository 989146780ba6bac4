// Package runtime defines the one interface a node uses to run sandboxes,
// whatever isolates them (gVisor's runsc here, Firecracker on hosts with
// KVM). Drivers live in sub-packages; the node package imports this one and
// picks a driver at start-up. Nothing in this package imports higher layers.
//
// A sandbox's life under a driver:
//
//	            Create                    Kill
//	(nothing) ─────────▶ running ─────────────────▶ (nothing)
//	                        │  ▲
//	                 Pause* │  │ Resume*
//	                        ▼  │
//	                      frozen
//
// (*) optional: only drivers whose Capabilities say so. Snapshot, restore
// and fork arrive with the snapshot work; they will be further small
// interfaces found by type assertion, as Nomad does for driver extras.
package runtime

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"os"
)

// ErrNotFound is returned for an id the driver does not know.
var ErrNotFound = errors.New("sandbox not found")

// ErrOutOfMemory is a build step the host's memory cgroup killed for going
// past its StepSpec.MemoryMB.
var ErrOutOfMemory = errors.New("killed: out of memory")

// Capabilities states, as data, what a driver can do beyond the core.
type Capabilities struct {
	// Pause is true when Pause/Resume freeze and thaw a sandbox in place.
	Pause bool
	// Checkpoint is true when the driver can save and restore a sandbox's
	// whole state.
	Checkpoint bool
}

// Spec is everything a driver needs to start one sandbox.
type Spec struct {
	// ID names the sandbox; it matches ^[a-z0-9]+$.
	ID string
	// Root is the root filesystem, as the node's provider prepared it.
	Root RootFS
	// EnvdPath is the host path of the static envd binary, which becomes
	// the sandbox's first process.
	EnvdPath string
	// EnvdPort is the TCP port envd listens on inside the sandbox.
	EnvdPort int
	// EnvdAccessToken, if not empty, must be presented to envd.
	EnvdAccessToken string
	// NetNSPath is the network namespace the sandbox joins. It must hold
	// only lo and eth0 with its address and default route in place.
	NetNSPath string
	// HostAddr is the address at which the host reaches the sandbox.
	HostAddr netip.Addr
	// CPUCount and MemoryMB bound the sandbox's resources.
	CPUCount int
	MemoryMB int
	// PidsLimit bounds the host tasks the sandbox takes (plus the
	// runtime's own); each user inside may run fewer (gvisor: 2/5 as many
	// processes and threads; past that fork fails with EAGAIN and the
	// sandbox lives on), as gVisor runs host tasks for guest ones. 0
	// means no limit.
	PidsLimit int
	// DiskMB is the size of the sandbox's writable filesystem, whose
	// files live on the host's disk (a sparse file), not in its memory:
	// past it writes fail with ENOSPC. 0 keeps the writes in memory. A
	// restore must be given the size the sandbox was saved with.
	DiskMB int
	// Hostname is the sandbox's host name.
	Hostname string
	// DNSServers go into the sandbox's /etc/resolv.conf.
	DNSServers []string
	// Prestarted marks a sandbox booted for the warm pool, before anyone
	// has asked for it: a runtime may keep what its boot warmed (gvisor:
	// the sentry's freed heap, see PrestartedAnnotation) until its first
	// use, and run it behind the sandboxes in use until its handout (see
	// Foregrounder).
	Prestarted bool
	// Binds are host paths bound into the sandbox: the node's own services
	// a template runs (the code interpreter, read-only), which must match
	// the node rather than the template's tree, and volumes (writable). A
	// restore must be given the binds the sandbox was saved with.
	Binds []Bind
}

// RootFS is a sandbox's root filesystem as a driver receives it: the
// template's read-only lower layer, on which the driver puts the
// sandbox's own writable layer (see Spec.DiskMB). Drivers must not write
// to it: every sandbox of a template on a node shares it.
type RootFS struct {
	// Dir is a host directory holding the tree: the template's directory,
	// or the mount of its block image.
	Dir string
	// Image, when set, is the block image Dir is mounted from (a file or
	// a device), for drivers that attach a disk instead of sharing a
	// directory (a VM's root).
	Image string
}

// Stats is a point-in-time reading of a sandbox's resource use.
type Stats struct {
	// CPUUsageNanos is cumulative CPU time used.
	CPUUsageNanos uint64
	// MemoryBytes is memory charged to the sandbox on the host.
	MemoryBytes uint64
	// DiskBytes is the host disk its writable filesystem takes.
	DiskBytes uint64
}

// FilesExporter is implemented by drivers that can save what a running
// sandbox wrote to its root filesystem, without its memory: a tar of its
// writable layer, deletions as overlay whiteouts (character devices 0/0).
type FilesExporter interface {
	ExportFiles(ctx context.Context, id, path string) error
}

// Foregrounder is implemented by drivers that run prestarted sandboxes
// (Spec.Prestarted) at a background CPU priority: a pool's boot that has
// begun yields to the sandboxes in use when they want the CPU back.
type Foregrounder interface {
	// Foreground gives prestarted sandbox id the CPU priority of a
	// sandbox in use; the node calls it as it hands the sandbox out.
	Foreground(ctx context.Context, id string) error
}

// LogReader is implemented by drivers that keep envd's own log of a
// running sandbox (the processes it started and ended).
type LogReader interface {
	// EnvdLog opens the files of envd's log of sandbox id, oldest first
	// (a part rotated out, then the current one), for the caller to close
	// (ErrNotFound once it is gone).
	EnvdLog(id string) ([]*os.File, error)
}

// EnvdServingMessage is the message of the line envd logs once it
// accepts connections (see EnvdWatcher).
const EnvdServingMessage = "envd serving"

// EnvdWatcher is implemented by drivers that read envd's log as envd
// writes it: a node waits for envd to say it serves instead of polling it
// from the moment the sandbox starts (each refused poll costs the sentry's
// network stack host CPU, ~130 µs here, beside the boot it waits for).
type EnvdWatcher interface {
	// EnvdServing returns a channel closed once envd in sandbox id has
	// logged EnvdServingMessage, or its log has ended; nil when the
	// driver cannot tell. Only a boot logs it: a restored envd serves
	// already.
	EnvdServing(id string) <-chan struct{}
}

// ExitNotifier is implemented by drivers that notice when a sandbox dies on
// its own (a host OOM kill, a crash), so that the node can clean up after it
// and tell the control plane.
type ExitNotifier interface {
	// Exits delivers every sandbox that ended without Kill.
	Exits() <-chan Exit
}

// Exit is a sandbox that ended on its own.
type Exit struct {
	ID string
	// OutOfMemory says the host's memory cgroup killed it for going past
	// its MemoryMB.
	OutOfMemory bool
}

// Recoverer is implemented by drivers whose sandboxes outlive the process
// that started them, so that a restarted node takes them over instead of
// losing them (as Nomad's RecoverTask does). At start the node asks for the
// Leftovers, Recovers those it still has a record of, and Kills the rest.
type Recoverer interface {
	// Leftovers lists the sandboxes a previous process of this driver
	// left on the host, whether or not they still run.
	Leftovers(ctx context.Context) ([]string, error)
	// Recover takes over leftover sandbox id as if this process had
	// started it: Kill, Stats, Checkpoint and exit events work on it again.
	// A leftover that no longer runs is ErrNotFound.
	Recover(ctx context.Context, id string) error
}

// StepSpec is one command for a Stepper to run to completion.
type StepSpec struct {
	// RootFS is the host directory the command runs in as its root; its
	// writes land there directly (a template being built).
	RootFS string
	// Argv, Env and Cwd are the command, its environment and directory.
	Argv, Env []string
	Cwd       string
	// UID and GID run it; root gets a container build's capabilities.
	UID, GID uint32
	// Binds are host paths bound read-only into the tree.
	Binds []Bind
	// NetNSPath, when set, is a network namespace prepared as a sandbox's
	// (see Spec.NetNSPath) the step gets network through; empty: none.
	NetNSPath string
	// DNSServers go into the step's /etc/resolv.conf (with NetNSPath).
	DNSServers []string
	// MemoryMB, CPUCount and PidsLimit bound the step as they bound a
	// sandbox (Spec's fields of the same names; 0: no bound). A step
	// killed for going past MemoryMB fails with ErrOutOfMemory.
	MemoryMB, CPUCount, PidsLimit int
}

// ToolsDir is where a sandbox finds envd and the node's tools: the node's
// own, read-only, never part of the sandbox's files.
const ToolsDir = "/.aenv"

// Bind is a host path bound read-only at Destination (absolute, inside
// the root filesystem).
type Bind struct {
	Source, Destination string
	// Writable binds it read-write (a volume).
	Writable bool
}

// Stepper is implemented by drivers that run one command to completion
// in a root filesystem they write straight into, without network: the
// RUN and COPY steps of a template build, so that builds run under the
// same driver, and on the same node, as sandboxes.
type Stepper interface {
	// RunStep runs spec, its output going to out, and returns its exit
	// code. A cancelled ctx kills it; nothing of it is left afterwards.
	RunStep(ctx context.Context, spec StepSpec, out io.Writer) (int, error)
}

// CheckpointOptions tune Checkpoint.
type CheckpointOptions struct {
	// LeaveRunning keeps the sandbox running after its state is saved
	// (snapshot, fork); otherwise it is stopped (pause).
	LeaveRunning bool
	// Freeze stops the sandbox's processes before its state is saved and
	// leaves them stopped, not gone: the caller checks the saved state
	// and then kills the sandbox, or Thaws it if the state is no good, so
	// that a pause that fails loses nothing. It implies LeaveRunning.
	Freeze bool
}

// Checkpointer is implemented by drivers that can save a sandbox's whole
// state (memory, processes, files written) and start new sandboxes from
// it: the basis of snapshot, pause/resume and fork.
type Checkpointer interface {
	// Checkpoint saves sandbox id's state into the empty directory
	// imageDir. Without LeaveRunning the sandbox stops; Kill removes it.
	Checkpoint(ctx context.Context, id, imageDir string, opts CheckpointOptions) error
	// Restore starts a new sandbox, spec.ID, from the state in imageDir.
	// spec must name the same root filesystem the state was saved from;
	// its network namespace may differ. On error nothing is left behind.
	Restore(ctx context.Context, spec Spec, imageDir string) error
	// Thaw lets a sandbox that Checkpoint froze run on.
	Thaw(ctx context.Context, id string) error
}

// Preparer is implemented by Checkpointers that can start a sandbox's
// processes before they know the state it restores: what a restore
// spends outside the saved state (gVisor: the sandbox and gofer
// processes, half a small restore) is then spent ahead, in a warm pool,
// and a restore only loads the state.
type Preparer interface {
	// Prepare starts the processes of a sandbox that RestorePrepared will
	// fill, as Create would (spec.ID names it in the runtime from now on),
	// but runs nothing in it. Kill removes one that is not needed.
	Prepare(ctx context.Context, spec Spec) error
	// RestorePrepared restores the state in imageDir into prepared
	// sandbox spec.ID, which keeps that id in the runtime; spec.Hostname
	// names the sandbox it becomes, and the rest of spec must be what it
	// was prepared with. On error the prepared sandbox is gone.
	RestorePrepared(ctx context.Context, spec Spec, imageDir string) error
}

// Runtime runs sandboxes on this host. Implementations are safe for
// concurrent use on different ids.
type Runtime interface {
	// Name identifies the driver ("gvisor", "firecracker").
	Name() string
	// Capabilities reports what the driver supports.
	Capabilities() Capabilities
	// Create starts a sandbox and returns once its first process runs. On
	// error nothing of the sandbox is left behind.
	Create(ctx context.Context, spec Spec) error
	// Kill stops a sandbox and removes every trace of it on the host,
	// leftovers of an earlier process included. Killing an unknown id
	// returns ErrNotFound.
	Kill(ctx context.Context, id string) error
	// Stats reads the sandbox's resource use.
	Stats(ctx context.Context, id string) (Stats, error)
}
