// Package node runs the sandboxes of one host: it joins a template's root
// filesystem, a network slot and a runtime driver into a running sandbox
// whose envd answers, and takes all of it apart again on kill. The control
// plane reaches it only through the node API, which package node/nodeserver
// answers with it: in the server's process on a single host, or in a node
// agent (package agent) across the network. Nothing below it knows about
// the API.
package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/aenvhq/aenv/internal/capacity"
	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/undo"
	"github.com/aenvhq/aenv/internal/volume"
)

// EnvdPort is the port envd listens on inside every sandbox (E2B's).
const EnvdPort = 49983

// ErrNotFound is returned for a sandbox id this node does not run.
var ErrNotFound = errors.New("sandbox not found")

// ErrExists is returned when creating a sandbox whose id is taken.
var ErrExists = errors.New("sandbox already exists")

// ErrInvalid is returned for a request that cannot be carried out as
// written (a mount at a relative path).
var ErrInvalid = errors.New("invalid request")

// ErrIncompatible is returned for a snapshot saved by another runtime or
// runtime version than this node's.
var ErrIncompatible = errors.New("snapshot saved by a different runtime")

// ErrNoRootImage is returned for a snapshot saved on an image of its
// template's files that this node cannot read: another host's base, with
// no store the nodes share.
var ErrNoRootImage = errors.New("the image the snapshot was saved on is not on this node")

// Network hands out and takes back per-sandbox network slots.
type Network interface {
	Acquire(ctx context.Context, opts netns.SlotOptions) (*netns.Slot, error)
	UpdateEgress(ctx context.Context, s *netns.Slot, opts netns.SlotOptions) error
	Release(ctx context.Context, s *netns.Slot) error
	// Adopt takes back, by name, a slot an earlier process handed out
	// (see Recover); ReleaseLeftovers destroys those nobody adopted.
	Adopt(name string) (*netns.Slot, error)
	ReleaseLeftovers(ctx context.Context) error
}

// DefaultDiskMB is a sandbox's disk unless configured: sparse, so it costs
// what is written.
const DefaultDiskMB = 10 << 10

// DefaultVolumeSize is a volume's size unless configured or asked for:
// sparse, so it costs what is written.
const DefaultVolumeSize = 10 << 30

// Config wires a node.
type Config struct {
	// ID names this node in logs and records.
	ID string
	// Runtime starts and stops sandboxes.
	Runtime runtime.Runtime
	// RuntimeVersion is the driver's version, recorded in snapshots: they
	// restore only under the same runtime and version.
	RuntimeVersion string
	// Network provides network slots.
	Network Network
	// Templates resolves template ids to root filesystems.
	Templates *template.Catalog
	// RootFS prepares templates' root filesystems for sandboxes (default:
	// their directories).
	RootFS RootFSProvider
	// Snapshots holds saved sandbox states; nil disables snapshots.
	Snapshots *snapshot.Catalog
	// Volumes holds the volumes of this node; nil: none.
	Volumes *volume.Dir
	// VolumeSize is the size in bytes of a volume created without one
	// (an ext4 image, sparse); 0 means DefaultVolumeSize, and a negative
	// value makes such volumes plain directories, unbounded.
	VolumeSize int64
	// Keys, the cluster's data keys, seal the envd tokens in the node's
	// local records (a record of a sandbox from before reads in clear);
	// nil keeps them in clear.
	Keys *sealed.Keyring
	// Store is the cluster's durable store, through which volumes move
	// between nodes; nil: they cannot.
	Store *store.Repository
	// EnvdPath is the static envd binary placed in every sandbox.
	EnvdPath string
	// EnvdVersion is the version the envd binary reports.
	EnvdVersion string
	// DNSServers go into sandboxes' resolv.conf.
	DNSServers []string
	// BuildWithoutNetwork runs template build steps without network
	// (they get a sandbox's open egress otherwise).
	BuildWithoutNetwork bool
	// ReadyTimeout bounds the wait for envd after start; 0 means 15s.
	ReadyTimeout time.Duration
	// MaxBoots bounds the sandboxes booting (or restoring) at once; the
	// rest wait their turn. 0 means DefaultBootsPerCPU per CPU of
	// Capacity; negative, no bound.
	MaxBoots int
	// WarmPoolMemory is the host memory, in bytes, the warm pool's
	// prestarted sandboxes may take together (what they really use, not
	// what they are configured with): the pool of each template (and
	// user snapshot) created from is sized to its recent peak burst of
	// creates within it. 0 means DefaultWarmPoolMemoryShare of
	// Capacity.MemoryMB, at most DefaultWarmPoolMemoryMax; negative
	// disables the pool.
	WarmPoolMemory int64
	// WarmPoolFloor is how many prestarted sandboxes of each of
	// WarmTemplates the pool keeps (within WarmPoolMemory) whatever the
	// demand, so that a node's first creates are served warm too, and,
	// where the runtime prepares, as many prepared for their restores.
	WarmPoolFloor int
	WarmTemplates []string
	// WarmPoolMax bounds each template's (and snapshot's) pool, floors
	// included; 0: only WarmPoolMemory does.
	WarmPoolMax int
	// Capacity is what the node may hand out (zero fields: the host's).
	Capacity Capacity
	// PidsLimit bounds each sandbox's host tasks (runtime.Spec's field),
	// unless its template sets its own; 0 means 1024.
	PidsLimit int
	// DiskMB is the size of each sandbox's writable filesystem (on the
	// host's disk, sparse), unless its template sets its own; 0 means
	// 10 GiB, and a negative value keeps writes in memory.
	DiskMB int
	// EndedHistory bounds what the node keeps of the sandboxes that left
	// it (their logs and metrics), and says where.
	EndedHistory EndedHistory
	// Idle says when the node reports its sandboxes idle (OnIdle), for
	// the cluster to pause them; the zero value reports none.
	Idle IdlePolicy
	// StateDir keeps a small local record of each sandbox handed out, so
	// that a restarted node takes its running sandboxes over (Recover);
	// empty keeps none. It belongs in the run directory: its records mean
	// nothing after a reboot.
	StateDir string
	// Logger receives the node's logs.
	Logger *slog.Logger

	// load and clock stand in for the host's load and the time in tests
	// (nil: /proc, and time.Now).
	load  hostLoad
	clock func() time.Time
}

// CreateRequest describes a sandbox to start.
type CreateRequest struct {
	// SandboxID is the new sandbox's id; empty lets the node choose (a
	// prestarted sandbox comes with its own).
	SandboxID string
	// TemplateID is a template id or alias to start from, unless
	// SnapshotID is set.
	TemplateID string
	// SnapshotID, when set, is the snapshot to restore the sandbox from
	// (a resume, a fork's child, a migration, a user snapshot).
	SnapshotID string
	// CPUCount and MemoryMB override the template's defaults when > 0.
	CPUCount int
	MemoryMB int
	// EnvVars are set for every process in the sandbox.
	EnvVars map[string]string
	// Network controls the sandbox's egress.
	Network netns.SlotOptions
	// Secure makes envd demand a per-sandbox access token.
	Secure bool
	// Mounts are volumes of this node to mount read-write.
	Mounts []snapshot.Mount
	// Reboot, with SnapshotID, boots afresh with the snapshot's files
	// instead of restoring its memory.
	Reboot bool
	// TeamID owns the sandbox: its history, once it ended, counts toward
	// the team's share of what the node keeps.
	TeamID string
}

// Sandbox is what a node knows of a sandbox it runs.
type Sandbox struct {
	ID              string
	TemplateID      string
	CPUCount        int
	MemoryMB        int
	DiskMB          int
	EnvdVersion     string
	EnvdAccessToken string
	// Team owns it (empty: a sandbox of no team, or prestarted).
	Team string
	// Mounts are the volumes mounted into it.
	Mounts []snapshot.Mount
	// RootImage is the block image its root filesystem is on (empty: the
	// template's directory): its snapshots restore on the same image,
	// whatever version of the template is current then.
	RootImage string
	// envVars are what it was created with (for a pause without memory,
	// whose resume boots afresh).
	envVars map[string]string
	// Addr is where the host reaches the sandbox (envd and user ports).
	Addr      netip.Addr
	StartedAt time.Time

	slot   *netns.Slot
	egress netns.SlotOptions
	// runtimeID names it to the runtime and the root filesystem provider
	// when that is not ID: a sandbox restored into a prepared one keeps
	// the prepared one's name there (see rt).
	runtimeID string
	// cpuBase and cpuAt are the previous CPU reading, for Usage.
	cpuBase uint64
	cpuAt   time.Time
	// logFrom, when set, is when its user's log starts: what envd logged
	// before (a prestarted sandbox's warming command and /init) is the
	// node's, not theirs.
	logFrom time.Time
	// initialised is set on a prestarted sandbox whose envd the pool gave
	// its template's /init and the access token EnvdAccessToken already
	// (see warmPool.initialise): a create that adds nothing hands it out
	// without a call into the sandbox.
	initialised bool
	// prestarted is set on a sandbox booted for the warm pool until its
	// handout, which gives it the CPU priority of a sandbox in use (see
	// runtime.Foregrounder).
	prestarted bool
}

// rt is sb's name to the runtime and the root filesystem provider.
func (sb *Sandbox) rt() string {
	if sb.runtimeID != "" {
		return sb.runtimeID
	}
	return sb.ID
}

// Node runs sandboxes on this host. It is safe for concurrent use.
type Node struct {
	cfg  Config
	log  *slog.Logger
	load hostLoad

	mu        sync.Mutex
	sandboxes map[string]*Sandbox
	// pending holds ids being created, so that a concurrent create or kill
	// of the same id sees it, with the memory admitted for each and since
	// when.
	pending map[string]pendingBoot
	// releasing holds, by runtime name, the sandboxes a pause stopped
	// whose processes, network and root filesystem are still being
	// released: a pause answers once the state is saved, and a boot under
	// the same runtime name (a resume that takes no prepared sandbox)
	// waits for the release to end.
	releasing map[string]chan struct{}
	// boots holds a token per sandbox booting (nil: no bound).
	boots  chan struct{}
	onExit func(Exit)
	onIdle func(Idle)
	// onPoolChange is OnPoolChange's fn; atomic, as the pool calls it
	// under its own lock.
	onPoolChange atomic.Pointer[func()]
	pool         *warmPool
	// readying starts each template's service once at a time; ready
	// holds the snapshots of started services by name.
	readying singleflight.Group
	ready    map[string]*snapshot.Snapshot
	// bg is cancelled by Close: work that outlives the request that began
	// it (starting a template's service) stops there, leaving nothing.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWork   sync.WaitGroup
	// hist holds each sandbox's resource samples and log.
	hist histories
	// imports orders the steps of each snapshot arriving from another
	// node (transfer.go).
	imports imports
}

// New returns a node; it does not start anything.
func New(cfg Config) (*Node, error) {
	if cfg.Runtime == nil || cfg.Network == nil || cfg.Templates == nil {
		return nil, errors.New("creating node: runtime, network and templates are required")
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 15 * time.Second
	}
	cfg.Capacity = withHostDefaults(cfg.Capacity)
	if cfg.MaxBoots == 0 {
		cfg.MaxBoots = DefaultBootsPerCPU * max(cfg.Capacity.CPUCount, 1)
	}
	if cfg.PidsLimit <= 0 {
		cfg.PidsLimit = 1024
	}
	if cfg.DiskMB == 0 {
		cfg.DiskMB = DefaultDiskMB
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RootFS == nil {
		cfg.RootFS = DirRootFS{}
	}
	n := &Node{
		cfg:       cfg,
		log:       cfg.Logger.With("node_id", cfg.ID),
		sandboxes: make(map[string]*Sandbox),
		pending:   make(map[string]pendingBoot),
		releasing: make(map[string]chan struct{}),
		ready:     make(map[string]*snapshot.Snapshot),
	}
	if cfg.MaxBoots > 0 {
		n.boots = make(chan struct{}, cfg.MaxBoots)
	}
	ended, err := newEndedStore(cfg.EndedHistory, n.log, time.Now)
	if err != nil {
		return nil, err
	}
	n.hist.ended, n.hist.log = ended, n.log
	n.bg, n.bgCancel = context.WithCancel(context.Background())
	n.load = cfg.load
	if n.load == nil {
		n.load = &procLoad{}
	}
	clock := cfg.clock
	if clock == nil {
		clock = time.Now
	}
	n.pool = newWarmPool(n, poolSizing{budget: warmPoolBudget(cfg), floor: cfg.WarmPoolFloor, ceiling: cfg.WarmPoolMax,
		floors: cfg.WarmTemplates}, clock)
	// Both goroutines are the node's: Close ends them and waits.
	if en, ok := cfg.Runtime.(runtime.ExitNotifier); ok {
		n.bgWork.Add(1)
		go func() {
			defer n.bgWork.Done()
			n.handleExits(n.bg, en.Exits())
		}()
	}
	n.bgWork.Add(1)
	go func() {
		defer n.bgWork.Done()
		n.sampleLoop()
	}()
	return n, nil
}

// warmPoolBudget is the warm pool's budget of host memory in bytes (0:
// none) for cfg, whose capacity has its defaults.
func warmPoolBudget(cfg Config) int64 {
	switch {
	case cfg.WarmPoolMemory < 0:
		return 0
	case cfg.WarmPoolMemory > 0:
		return cfg.WarmPoolMemory
	}
	return min(int64(DefaultWarmPoolMemoryShare*float64(cfg.Capacity.MemoryMB))<<20, DefaultWarmPoolMemoryMax)
}

// Exit is a sandbox that died on its own.
type Exit struct {
	ID string
	// Reason says why, as a user should read it.
	Reason string
	// OutOfMemory says it was killed for going past its memory limit.
	OutOfMemory bool
}

// OnExit registers fn to be told of every sandbox that died on its own,
// after the node has cleaned up after it.
func (n *Node) OnExit(fn func(Exit)) {
	n.mu.Lock()
	n.onExit = fn
	n.mu.Unlock()
}

// handleExits frees what sandboxes that died on their own held (a memory
// cgroup OOM kill takes the whole gVisor sandbox) and reports them, until
// the node closes (ctx) or the driver does (exits). An exit the closed
// node leaves unread is the next process's: its Recover finds the
// sandbox gone and removes what is left.
func (n *Node) handleExits(ctx context.Context, exits <-chan runtime.Exit) {
	for {
		var ex runtime.Exit
		select {
		case <-ctx.Done():
			return
		case e, ok := <-exits:
			if !ok {
				return
			}
			ex = e
		}
		// The runtime names a sandbox restored into a prepared one by the
		// prepared one's name.
		// A paused sandbox being released runs under its id while its
		// resume runs under a prepared one's name: the exit is the old
		// one's, which its release frees.
		id := ex.ID
		n.mu.Lock()
		sb, ok := n.sandboxes[id]
		if ok && sb.rt() != ex.ID {
			ok = false
		}
		if !ok {
			for _, s := range n.sandboxes {
				if s.rt() == ex.ID {
					sb, ok, id = s, true, s.ID
					break
				}
			}
		}
		if ok {
			delete(n.sandboxes, id)
		}
		onExit := n.onExit
		n.mu.Unlock()
		if !ok {
			if sb = n.pool.remove(id); sb == nil {
				continue // a create in progress fails on its own
			}
			onExit = nil
		}
		dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := n.destroy(dctx, sb); err != nil {
			n.log.Warn("cleaning up exited sandbox", "sandbox_id", id, "err", err)
		}
		cancel()
		reason := "the sandbox exited unexpectedly"
		if ex.OutOfMemory {
			reason = fmt.Sprintf("killed: out of memory (memoryMB=%d)", sb.MemoryMB)
		}
		n.log.Warn("sandbox ended on its own; cleaned up", "sandbox_id", id, "reason", reason)
		if onExit != nil {
			n.logEvent(id, "error", describeExit(Exit{Reason: reason, OutOfMemory: ex.OutOfMemory}))
			n.historyEnded(id)
			onExit(Exit{ID: id, Reason: reason, OutOfMemory: ex.OutOfMemory})
		}
	}
}

// ID returns the node's id.
func (n *Node) ID() string { return n.cfg.ID }

// Create starts a sandbox and returns once its envd answers: a prestarted
// one from the warm pool when one fits, else a fresh boot. A failed create
// leaves nothing behind.
func (n *Node) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	// The caller says which it starts from: a snapshot is never looked
	// for under a template's name, nor a template under a snapshot's.
	if req.SnapshotID != "" {
		if n.cfg.Snapshots == nil {
			return nil, fmt.Errorf("restoring sandbox from snapshot %s: %w: this node keeps no snapshots", req.SnapshotID, ErrUnsupported)
		}
		snap, err := n.cfg.Snapshots.Fetch(ctx, req.SnapshotID)
		if err != nil {
			return nil, fmt.Errorf("restoring sandbox from snapshot %s: %w", req.SnapshotID, err)
		}
		if snapshotPoolable(snap, req) {
			start := time.Now()
			if sb := n.pool.take(PoolKey{SnapshotID: snap.ID}, snap.ID); sb != nil {
				err := n.activateRestored(ctx, sb, req)
				if err == nil {
					n.log.Info("sandbox restored", "sandbox_id", sb.ID, "snapshot_id", snap.ID, "warm", true,
						"total_ms", time.Since(start).Milliseconds())
					n.logEvent(sb.ID, "info", "sandbox restored", "snapshot_id", snap.ID, "kind", string(snap.Kind),
						"prestarted", "true", "took_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
					return sb, nil
				}
				if ctx.Err() != nil {
					return nil, err
				}
				n.pool.untake(PoolKey{SnapshotID: snap.ID})
				n.log.Warn("prestarted sandbox unusable; restoring a fresh one", "sandbox_id", sb.ID, "err", err)
			}
		}
		return n.restore(ctx, snap, req)
	}
	tpl, err := n.lookupTemplate(ctx, req.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox: %w", err)
	}
	start := time.Now()
	if len(req.Mounts) > 0 && n.hasService(tpl) {
		return nil, fmt.Errorf("creating sandbox: %w: volumes cannot be mounted into sandboxes of a template with a start command (%s) yet; they start from a snapshot saved without them", ErrUnsupported, tpl.ID)
	}
	// Prestarted sandboxes cannot gain mounts nor change size: those
	// creates boot fresh.
	key := PoolKey{TemplateID: tpl.ID}
	var sb *Sandbox
	if poolable(tpl, req) {
		sb = n.pool.take(key, templateVersion(tpl))
	}
	if sb != nil {
		err := n.activate(ctx, sb, tpl, req)
		if err == nil {
			n.log.Info("sandbox created", "sandbox_id", sb.ID, "template_id", tpl.ID, "warm", true,
				"total_ms", time.Since(start).Milliseconds())
			n.logEvent(sb.ID, "info", "sandbox created", "template", tpl.ID, "prestarted", "true",
				"took_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
			return sb, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		// A prestarted sandbox that went bad while it waited (activate
		// destroyed it) must not fail the user's create: boot a fresh one.
		n.pool.untake(key)
		n.log.Warn("prestarted sandbox unusable; booting a fresh one", "sandbox_id", sb.ID, "err", err)
	}
	id := req.SandboxID
	if id == "" {
		id = NewID()
	}
	if n.hasService(tpl) {
		sb, err = n.bootService(ctx, id, tpl, bootOptions{Network: req.Network})
	} else {
		sb, err = n.boot(ctx, id, tpl, bootOptions{CPUCount: req.CPUCount, MemoryMB: req.MemoryMB, Network: req.Network, Mounts: req.Mounts})
	}
	if err != nil {
		return nil, err
	}
	if err := n.activate(ctx, sb, tpl, req); err != nil {
		return nil, err
	}
	n.log.Info("sandbox created", "sandbox_id", sb.ID, "template_id", tpl.ID, "warm", false,
		"total_ms", time.Since(start).Milliseconds())
	n.logEvent(sb.ID, "info", "sandbox created", "template", tpl.ID, "prestarted", "false",
		"took_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
	return sb, nil
}

// bootOptions are what a boot needs beyond the template.
type bootOptions struct {
	CPUCount, MemoryMB int
	Network            netns.SlotOptions
	// ImageDir, when set, restores the saved state there instead of
	// booting; DiskMB is then the saved sandbox's disk, and RootImage the
	// image its root ran on.
	ImageDir  string
	DiskMB    int
	RootImage string
	// Mounts are volumes to bind read-write.
	Mounts []snapshot.Mount
	// ForPool boots a sandbox for the warm pool: one that never makes
	// room for itself by evicting prestarted ones.
	ForPool bool
}

// boot starts a sandbox of tpl and waits for its envd; the sandbox is not
// yet initialised nor registered. A restore takes a prepared sandbox of
// the warm pool where one fits (see preparedKey). On error nothing is
// left behind.
func (n *Node) boot(ctx context.Context, id string, tpl *template.Template, opts bootOptions) (sb *Sandbox, err error) {
	memMB, cpus := pick(opts.MemoryMB, tpl.MemoryMB), pick(opts.CPUCount, tpl.CPUCount)
	if err := n.admitBoot(id, memMB, cpus, opts.ForPool); err != nil {
		return nil, err
	}
	// A booted sandbox stays pending (its memory counted) until it is
	// registered, pooled or destroyed.
	defer func() {
		if err != nil {
			n.unpend(id)
		}
	}()
	queued := time.Now()
	if err := n.awaitBootTurn(ctx); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	defer n.endBootTurn()

	sb = &Sandbox{
		ID:          id,
		TemplateID:  tpl.ID,
		CPUCount:    cpus,
		MemoryMB:    memMB,
		DiskMB:      pick(tpl.DiskMB, n.cfg.DiskMB),
		EnvdVersion: n.cfg.EnvdVersion,
		Mounts:      opts.Mounts,
		prestarted:  opts.ForPool,
	}
	if opts.ImageDir != "" {
		sb.DiskMB = opts.DiskMB // the saved state's layout, whatever the template says now
	}
	if key, ok := n.preparedKey(tpl, sb, opts); ok {
		if prep := n.pool.take(key, templateVersion(tpl)); prep != nil {
			err := n.bootOnce(ctx, sb, tpl, opts, prep, queued)
			if err == nil || ctx.Err() != nil {
				return sb, err
			}
			// The restore into it failed (and removed it): the restore
			// is tried as one that starts its own sandbox.
			n.pool.untake(key)
			n.log.Warn("restoring into a prepared sandbox failed; restoring without one", "sandbox_id", id, "prepared_id", prep.ID, "err", err)
			sb.runtimeID, sb.slot, sb.Addr, sb.egress = "", nil, netip.Addr{}, netns.SlotOptions{}
		}
	}
	return sb, n.bootOnce(ctx, sb, tpl, opts, nil, queued)
}

// bootOnce starts sb, which boot admitted: into prep, a prepared
// sandbox taken from the pool, when that is set. On error nothing of it
// is left behind (prep included).
func (n *Node) bootOnce(ctx context.Context, sb *Sandbox, tpl *template.Template, opts bootOptions, prep *Sandbox, queued time.Time) (err error) {
	log := n.log.With("sandbox_id", sb.ID)
	start := time.Now()
	var rollback undo.Stack
	defer func() {
		if err != nil {
			rollback.Run(context.WithoutCancel(ctx), log)
		}
	}()
	if prep != nil {
		// What the prepared sandbox was set up with is the restore's: its
		// network slot (egress closed until now), its root filesystem,
		// its name in the runtime.
		sb.runtimeID, sb.slot, sb.Addr, sb.egress = prep.ID, prep.slot, prep.Addr, prep.egress
	} else if err := n.awaitRelease(ctx, sb.rt()); err != nil {
		return fmt.Errorf("creating sandbox %s: %w", sb.ID, err)
	}
	spec, err := n.provision(ctx, sb, tpl, opts, &rollback)
	if err == nil && prep != nil {
		err = n.applyEgress(ctx, sb, opts.Network)
	}
	if err != nil {
		if prep != nil {
			if kerr := n.cfg.Runtime.Kill(context.WithoutCancel(ctx), prep.ID); kerr != nil {
				log.Warn("removing a prepared sandbox not used", "prepared_id", prep.ID, "err", kerr)
			}
		}
		return fmt.Errorf("creating sandbox %s: %w", sb.ID, err)
	}
	prepared := time.Now()
	switch cp, ok := n.cfg.Runtime.(runtime.Checkpointer); {
	case opts.ImageDir == "":
		err = n.cfg.Runtime.Create(ctx, spec)
	case prep != nil:
		err = n.cfg.Runtime.(runtime.Preparer).RestorePrepared(ctx, spec, opts.ImageDir)
	case ok:
		err = cp.Restore(ctx, spec, opts.ImageDir)
	default:
		err = fmt.Errorf("runtime %s cannot restore snapshots", n.cfg.Runtime.Name())
	}
	if err != nil {
		return fmt.Errorf("creating sandbox %s: %w", sb.ID, err)
	}
	rtID := sb.rt()
	rollback.Push("killing sandbox", func(ctx context.Context) error { return n.cfg.Runtime.Kill(ctx, rtID) })
	started := time.Now()

	var serving <-chan struct{}
	if w, ok := n.cfg.Runtime.(runtime.EnvdWatcher); ok && opts.ImageDir == "" {
		serving = w.EnvdServing(rtID)
	}
	readyCtx, cancel := context.WithTimeout(ctx, n.cfg.ReadyTimeout)
	defer cancel()
	if err := newEnvdClient(sb.Addr, "").waitReady(readyCtx, serving); err != nil {
		return fmt.Errorf("creating sandbox %s: waiting for envd: %w", sb.ID, err)
	}
	log.Debug("sandbox booted", "template_id", tpl.ID, "runtime_id", sb.rt(), "addr", sb.Addr, "queued_ms", start.Sub(queued).Milliseconds(),
		"prepared", prep != nil, "setup_ms", prepared.Sub(start).Milliseconds(),
		"runtime_ms", started.Sub(prepared).Milliseconds(),
		"envd_ready_ms", time.Since(started).Milliseconds())
	return nil
}

// provision gives sb what its runtime spec names, pushing on rollback
// what undoes each: a network slot with opts.Network's egress (unless sb
// has one), its root filesystem with the template's tools and opts'
// volumes bound in (under sb.rt()). It returns the spec.
func (n *Node) provision(ctx context.Context, sb *Sandbox, tpl *template.Template, opts bootOptions, rollback *undo.Stack) (runtime.Spec, error) {
	if sb.slot == nil {
		slot, err := n.cfg.Network.Acquire(ctx, opts.Network)
		if err != nil {
			return runtime.Spec{}, fmt.Errorf("acquiring network: %w", err)
		}
		sb.slot, sb.Addr, sb.egress = slot, slot.HostAddr, opts.Network
	}
	slot := sb.slot
	rollback.Push("releasing network", func(ctx context.Context) error { return n.cfg.Network.Release(ctx, slot) })
	binds, err := n.toolBinds(tpl)
	if err != nil {
		return runtime.Spec{}, err
	}
	vbinds, err := n.volumeBinds(opts.Mounts)
	if err != nil {
		return runtime.Spec{}, err
	}
	binds = append(binds, vbinds...)
	rtID := sb.rt()
	// Preparing again under the same name (a prepared sandbox's) is a
	// no-op that returns what it holds.
	root, err := n.cfg.RootFS.Prepare(ctx, tpl, rtID, binds)
	if err != nil {
		return runtime.Spec{}, err
	}
	rollback.Push("releasing the root filesystem", func(ctx context.Context) error { return n.cfg.RootFS.Release(ctx, rtID) })
	sb.RootImage = tpl.RootImage()
	return runtime.Spec{
		Binds:      binds,
		ID:         rtID,
		Hostname:   sb.ID,
		Root:       root,
		EnvdPath:   n.cfg.EnvdPath,
		EnvdPort:   EnvdPort,
		NetNSPath:  slot.SandboxNSPath,
		HostAddr:   slot.HostAddr,
		CPUCount:   sb.CPUCount,
		MemoryMB:   sb.MemoryMB,
		PidsLimit:  pick(tpl.PidsLimit, n.cfg.PidsLimit),
		DiskMB:     max(sb.DiskMB, 0),
		DNSServers: n.cfg.DNSServers,
		Prestarted: opts.ForPool,
	}, nil
}

// preparedMB is what a prepared sandbox is counted at in admission and
// the pool's budget before one is measured: its sandbox and gofer
// processes took 10 MiB here, with nothing restored into them.
const preparedMB = 16

// preparedKey is the warm pool's key of the prepared sandboxes a restore
// of sb (boot's, before it starts) can take, if it can take one: the
// runtime can prepare, and sb mounts no volume. Prepared sandboxes are
// kept per size (the size of the sandbox, its disk and what is bound in
// are fixed once it is prepared): the template's own, or sb's when it
// differs. The pool's own restores take none.
func (n *Node) preparedKey(tpl *template.Template, sb *Sandbox, opts bootOptions) (PoolKey, bool) {
	if _, ok := n.cfg.Runtime.(runtime.Preparer); !ok || opts.ImageDir == "" || opts.ForPool || len(opts.Mounts) > 0 {
		return PoolKey{}, false
	}
	if opts.RootImage != tpl.RootImage() {
		// The prepared sandboxes mount the template's image (or its tree
		// through a gofer), and a restore must mount its root as it was
		// saved: the runtime would refuse, after the prepared sandbox
		// was spent (a snapshot from before base ran from its image).
		return PoolKey{}, false
	}
	key := PoolKey{TemplateID: tpl.ID, Restores: true}
	// A disk of -1 (files in memory) is saved as 0 (WritableMB): both
	// are a spec's 0.
	shape := Shape{CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskMB: max(sb.DiskMB, 0)}
	if shape != n.templateShape(tpl) {
		key.Shape = shape
	}
	return key, true
}

// templateShape is the size of tpl's sandboxes that ask for none.
func (n *Node) templateShape(tpl *template.Template) Shape {
	return Shape{CPUCount: tpl.CPUCount, MemoryMB: tpl.MemoryMB, DiskMB: max(pick(tpl.DiskMB, n.cfg.DiskMB), 0)}
}

// prepare starts a prepared sandbox of tpl for the warm pool (see
// runtime.Preparer), sized shape (the zero Shape: the template's own): a
// sandbox with its network slot (egress closed) and root filesystem,
// into which a restore of the template's sandboxes loads its state. It
// stays pending, as a boot does, until the pool holds it.
func (n *Node) prepare(ctx context.Context, tpl *template.Template, shape Shape) (sb *Sandbox, err error) {
	pr, ok := n.cfg.Runtime.(runtime.Preparer)
	if !ok {
		return nil, fmt.Errorf("preparing a sandbox of %s: runtime %s: %w", tpl.ID, n.cfg.Runtime.Name(), ErrUnsupported)
	}
	if shape == (Shape{}) {
		shape = n.templateShape(tpl)
	}
	id := NewID()
	if err := n.admitBoot(id, preparedMB, 0, true); err != nil {
		return nil, err
	}
	var rollback undo.Stack
	defer func() {
		if err != nil {
			rollback.Run(context.WithoutCancel(ctx), n.log.With("sandbox_id", id))
			n.unpend(id)
		}
	}()
	if err := n.awaitBootTurn(ctx); err != nil {
		return nil, fmt.Errorf("preparing sandbox %s: %w", id, err)
	}
	defer n.endBootTurn()
	sb = &Sandbox{ID: id, TemplateID: tpl.ID, CPUCount: shape.CPUCount, MemoryMB: shape.MemoryMB,
		DiskMB: shape.DiskMB, EnvdVersion: n.cfg.EnvdVersion}
	spec, err := n.provision(ctx, sb, tpl, bootOptions{}, &rollback)
	if err != nil {
		return nil, fmt.Errorf("preparing sandbox %s: %w", id, err)
	}
	if err := pr.Prepare(ctx, spec); err != nil {
		return nil, fmt.Errorf("preparing sandbox %s: %w", id, err)
	}
	return sb, nil
}

// DefaultBootsPerCPU is how many sandboxes boot at once per CPU by
// default. A boot is CPU-bound (runsc, its gofer and the sentry start
// for ~90% of its wall time), so a burst started all at once finishes
// all at once, late, and starves the rest of the process meanwhile (50
// at once on 2 cores took 7 s each, and their etcd writes and envd
// dials timed out); taken a few at a time, the first are ready early
// and the last no later (its p50 halved).
const DefaultBootsPerCPU = 2

// awaitBootTurn waits until fewer than MaxBoots sandboxes boot.
func (n *Node) awaitBootTurn(ctx context.Context) error {
	if n.boots == nil {
		return nil
	}
	select {
	case n.boots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for a turn to boot (%d boot at once): %w", cap(n.boots), ctx.Err())
	}
}

// endBootTurn ends a turn awaitBootTurn began.
func (n *Node) endBootTurn() {
	if n.boots != nil {
		<-n.boots
	}
}

// unpend ends the count of a boot of id as pending (the sandbox it made
// is counted elsewhere now, or gone), and wakes the warm pool, which
// refills only while nothing boots.
func (n *Node) unpend(id string) {
	n.mu.Lock()
	delete(n.pending, id)
	n.mu.Unlock()
	n.pool.poke()
}

// pendingBoot is a boot admitted and not yet registered, pooled or gone.
type pendingBoot struct {
	mb     int // the memory admitted for it, MiB
	since  time.Time
	warned bool // stuckBoots has reported it
}

// stuckBootAfter is how long a boot may count as in progress before the
// node warns of it: every boot is bounded far below it, and while one
// counts, the warm pool does not refill (hostIdle), so one that never
// ends (a path that forgot to unpend) would stop every pool silently.
const stuckBootAfter = 10 * time.Minute

// stuckBoots returns the ids of the boots that have counted as in
// progress for stuckBootAfter as of now, each once.
func (n *Node) stuckBoots(now time.Time) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var ids []string
	for id, p := range n.pending {
		if !p.warned && now.Sub(p.since) > stuckBootAfter {
			p.warned = true
			n.pending[id] = p
			ids = append(ids, id)
		}
	}
	return ids
}

// admitBoot admits a boot of memMB and cpus under id, counting it as
// pending. A boot that does not fit beside the warm pool's prestarted
// sandboxes kills some to make room (unless it is the pool's own): a
// cache does not refuse the work it is there for.
func (n *Node) admitBoot(id string, memMB, cpus int, forPool bool) error {
	used := n.memoryUsed()
	disk := diskUsed(n.cfg.StateDir)
	for evicted := false; ; evicted = true {
		poolMB := n.pool.memoryMB()
		n.mu.Lock()
		_, running := n.sandboxes[id]
		_, creating := n.pending[id]
		if running || (creating && !evicted) {
			n.mu.Unlock()
			return fmt.Errorf("creating sandbox %s: %w", id, ErrExists)
		}
		// After an eviction, its own reservation is in the count.
		delete(n.pending, id)
		committed := n.committedMBLocked(poolMB)
		err := admit(n.cfg.Capacity, memMB, cpus, committed, used, disk)
		if err == nil {
			n.pending[id] = pendingBoot{mb: memMB, since: time.Now()}
			n.mu.Unlock()
			return nil
		}
		short := -n.cfg.Capacity.HeadroomMB(capacity.Request{MemoryMB: memMB, CPUs: cpus}, capacity.Load{CommittedMB: committed})
		if forPool || evicted || !errors.Is(err, ErrNoCapacity) || short <= 0 || short > poolMB {
			n.mu.Unlock()
			if !forPool && poolMB > 0 && errors.Is(err, ErrNoCapacity) {
				n.pool.poke() // under memory pressure it shrinks
			}
			return fmt.Errorf("creating sandbox %s: %w", id, err)
		}
		// The room it makes is its own: reserved, the refill neither
		// boots nor is admitted into it meanwhile.
		n.pending[id] = pendingBoot{mb: memMB, since: time.Now()}
		n.mu.Unlock()
		n.pool.evict(short)
	}
}

// activate hands a booted sandbox to its user: egress rules, envd's
// environment, user and token, then registration. A failure destroys sb.
func (n *Node) activate(ctx context.Context, sb *Sandbox, tpl *template.Template, req CreateRequest) (err error) {
	defer func() {
		if err != nil {
			n.destroy(context.WithoutCancel(ctx), sb)
		}
	}()
	if err := n.foreground(ctx, sb); err != nil {
		return err
	}
	// Prestarted sandboxes were booted with the pool's egress rules.
	if err := n.applyEgress(ctx, sb, req.Network); err != nil {
		return err
	}
	sb.envVars = req.EnvVars
	sb.logFrom = time.Now()
	switch {
	case sb.initialised && req.Secure && len(req.EnvVars) == 0:
		// The pool's /init gave it all such a create would.
	case sb.initialised:
		ireq := initFor(tpl, req.EnvVars, sb.EnvdAccessToken)
		if !req.Secure {
			ireq.AccessToken, ireq.DropAccessToken = "", true
		}
		if err := newEnvdClient(sb.Addr, sb.EnvdAccessToken).init(ctx, ireq); err != nil {
			return fmt.Errorf("creating sandbox %s: initialising envd: %w", sb.ID, err)
		}
		sb.EnvdAccessToken = ireq.AccessToken
	default:
		if req.Secure {
			sb.EnvdAccessToken = randomToken()
		}
		// The token goes in through /init rather than the sandbox's
		// start-up environment, so that prestarted sandboxes can get
		// theirs when taken.
		if err := newEnvdClient(sb.Addr, "").init(ctx, initFor(tpl, req.EnvVars, sb.EnvdAccessToken)); err != nil {
			return fmt.Errorf("creating sandbox %s: initialising envd: %w", sb.ID, err)
		}
	}
	n.register(ctx, sb, req.TeamID)
	return nil
}

// foreground gives prestarted sb, as it is handed out, the CPU priority
// of a sandbox in use, where the runtime ran it behind them.
func (n *Node) foreground(ctx context.Context, sb *Sandbox) error {
	if !sb.prestarted {
		return nil
	}
	if f, ok := n.cfg.Runtime.(runtime.Foregrounder); ok {
		if err := f.Foreground(ctx, sb.rt()); err != nil {
			return fmt.Errorf("creating sandbox %s: %w", sb.ID, err)
		}
	}
	sb.prestarted = false
	return nil
}

// applyEgress gives a prestarted sandbox the create's egress rules where
// they differ from those it was booted with.
func (n *Node) applyEgress(ctx context.Context, sb *Sandbox, rules netns.SlotOptions) error {
	if sb.egress.Equal(rules) {
		return nil
	}
	if err := n.cfg.Network.UpdateEgress(ctx, sb.slot, rules); err != nil {
		return fmt.Errorf("creating sandbox %s: setting egress rules: %w", sb.ID, err)
	}
	sb.egress = rules
	return nil
}

// activateRestored hands a prestarted sandbox restored from a user
// snapshot to its user: the create's egress rules, and a token of its own
// (its siblings from the same snapshot must not share one), then
// registration. A failure destroys sb.
func (n *Node) activateRestored(ctx context.Context, sb *Sandbox, req CreateRequest) (err error) {
	defer func() {
		if err != nil {
			n.destroy(context.WithoutCancel(ctx), sb)
		}
	}()
	if err := n.foreground(ctx, sb); err != nil {
		return err
	}
	if err := n.applyEgress(ctx, sb, req.Network); err != nil {
		return err
	}
	if old := sb.EnvdAccessToken; old != "" {
		fresh := randomToken()
		if err := newEnvdClient(sb.Addr, old).init(ctx, initRequest{AccessToken: fresh, Timestamp: time.Now().UTC()}); err != nil {
			return fmt.Errorf("creating sandbox %s: giving it its own envd token: %w", sb.ID, err)
		}
		sb.EnvdAccessToken = fresh
	}
	n.register(ctx, sb, req.TeamID)
	return nil
}

// initFor is envd's /init for a sandbox of tpl: the image's environment
// and working directory, then env (which wins) and the access token.
func initFor(tpl *template.Template, env map[string]string, token string) initRequest {
	ireq := initRequest{EnvVars: env, AccessToken: token, DefaultUser: "user", Timestamp: time.Now().UTC()}
	if img := tpl.Image; img != nil {
		all := map[string]string{}
		for _, kv := range img.Env {
			if k, v, ok := strings.Cut(kv, "="); ok {
				all[k] = v
			}
		}
		maps.Copy(all, env)
		ireq.EnvVars = all
		ireq.DefaultWorkdir = img.WorkingDir
	}
	return ireq
}

// register makes sb, of team, visible, starting its CPU accounting now (a
// prestarted sandbox's boot is not its user's).
func (n *Node) register(ctx context.Context, sb *Sandbox, team string) {
	sb.Team = team
	sb.StartedAt = time.Now().UTC()
	sb.cpuAt = sb.StartedAt
	if st, err := n.cfg.Runtime.Stats(ctx, sb.rt()); err == nil {
		sb.cpuBase = st.CPUUsageNanos
	}
	n.historyStarted(sb.ID, team, sb.logFrom)
	if err := n.saveRecord(sb); err != nil {
		// The sandbox works; only a restart of this process would lose it.
		n.log.Warn("keeping local record", "sandbox_id", sb.ID, "err", err)
	}
	n.mu.Lock()
	n.sandboxes[sb.ID] = sb
	delete(n.pending, sb.ID)
	n.mu.Unlock()
	n.pool.poke()
	// Its history starts with its first moment, not 5 s later.
	n.sample(ctx, sb)
}

// destroy kills a sandbox that is not (or no longer) registered.
func (n *Node) destroy(ctx context.Context, sb *Sandbox) error {
	n.removeRecord(sb.ID)
	n.keepEnvdEvents(sb)
	err := n.release(ctx, sb)
	n.unpend(sb.ID) // a boot that went no further
	return err
}

// release frees what runs sb under its runtime name: its runtime
// sandbox, network slot and root filesystem. Nothing of it is keyed by
// the sandbox's id, so a new incarnation of that id (a resume into a
// prepared sandbox) may run meanwhile.
func (n *Node) release(ctx context.Context, sb *Sandbox) error {
	var errs []error
	start := time.Now()
	if err := n.cfg.Runtime.Kill(ctx, sb.rt()); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		errs = append(errs, err)
	}
	killed := time.Now()
	if err := n.cfg.Network.Release(ctx, sb.slot); err != nil {
		errs = append(errs, err)
	}
	released := time.Now()
	if err := n.cfg.RootFS.Release(ctx, sb.rt()); err != nil {
		errs = append(errs, err)
	}
	n.log.Debug("sandbox destroyed", "sandbox_id", sb.ID, "runtime_id", sb.rt(), "runtime_ms", killed.Sub(start).Milliseconds(),
		"network_ms", released.Sub(killed).Milliseconds(), "rootfs_ms", time.Since(released).Milliseconds())
	return errors.Join(errs...)
}

// releaseLater destroys sb, stopped and unregistered, and whose envd
// events its history holds already: what is keyed by its id (its local
// record) at once, what runs it (a runsc delete, its network and root
// filesystem; a third of a pause's time) in the background, which its
// caller need not wait for. Close waits for it.
func (n *Node) releaseLater(sb *Sandbox) {
	n.removeRecord(sb.ID)
	rtID := sb.rt()
	done := make(chan struct{})
	n.mu.Lock()
	n.releasing[rtID] = done
	n.mu.Unlock()
	n.bgWork.Add(1)
	go func() {
		defer n.bgWork.Done()
		start := time.Now()
		if err := n.release(context.Background(), sb); err != nil {
			n.log.Warn("releasing paused sandbox", "sandbox_id", sb.ID, "runtime_id", rtID, "err", err)
		}
		n.log.Debug("paused sandbox released", "sandbox_id", sb.ID, "runtime_id", rtID, "took_ms", time.Since(start).Milliseconds())
		n.mu.Lock()
		delete(n.releasing, rtID)
		n.mu.Unlock()
		close(done)
	}()
}

// awaitRelease waits until the runtime sandbox named rtID, if a pause is
// releasing it, is gone, so that a boot may take the name again. A
// restore into a prepared sandbox runs under that one's name and need
// not wait: a resume right after a pause would otherwise wait out the
// pause's runsc delete (60-130 ms here).
func (n *Node) awaitRelease(ctx context.Context, rtID string) error {
	n.mu.Lock()
	done := n.releasing[rtID]
	n.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the paused sandbox's release: %w", ctx.Err())
	}
}

// lookupTemplate finds template idOrAlias for a sandbox: the templates
// this host holds first (a directory read), then templates only the
// remote store has, fetched from the store once per host.
func (n *Node) lookupTemplate(ctx context.Context, idOrAlias string) (*template.Template, error) {
	tpl, err := n.cfg.Templates.GetLocal(idOrAlias)
	if errors.Is(err, template.ErrNotFound) {
		tpl, err = n.template(ctx, idOrAlias)
	}
	return tpl, err
}

// template resolves a template this host may lack: its description, when
// the root filesystem provider serves it without its files here, else
// the template fetched whole.
func (n *Node) template(ctx context.Context, idOrAlias string) (*template.Template, error) {
	tpl, err := n.cfg.Templates.Get(idOrAlias)
	if err != nil || !tpl.Remote || n.cfg.RootFS.Serves(tpl) {
		return tpl, err
	}
	return n.cfg.Templates.Fetch(ctx, idOrAlias)
}

// Get returns a running sandbox.
func (n *Node) Get(id string) (*Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("looking up sandbox %s: %w", id, ErrNotFound)
	}
	return sb, nil
}

// RootImages lists the block images the node's sandboxes run on (the warm
// pool's included), each once.
func (n *Node) RootImages() []string {
	seen := map[string]bool{}
	n.mu.Lock()
	for _, sb := range n.sandboxes {
		if sb.RootImage != "" {
			seen[sb.RootImage] = true
		}
	}
	n.mu.Unlock()
	for _, sb := range n.pool.list() {
		if sb.RootImage != "" {
			seen[sb.RootImage] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// List returns the running sandboxes ordered by id.
func (n *Node) List() []*Sandbox {
	n.mu.Lock()
	out := make([]*Sandbox, 0, len(n.sandboxes))
	for _, sb := range n.sandboxes {
		out = append(out, sb)
	}
	n.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Kill stops a sandbox and frees everything it held.
func (n *Node) Kill(ctx context.Context, id string) error {
	n.mu.Lock()
	sb, ok := n.sandboxes[id]
	delete(n.sandboxes, id)
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("killing sandbox %s: %w", id, ErrNotFound)
	}
	if err := n.destroy(ctx, sb); err != nil {
		return fmt.Errorf("killing sandbox %s: %w", id, err)
	}
	n.log.Info("sandbox killed", "sandbox_id", id)
	n.logEvent(id, "info", "sandbox killed")
	n.historyEnded(id)
	return nil
}

// CloseMode says what Close does with the sandboxes a node runs. It is
// not membership.StopMode, the process's choice, which also has pausing:
// a node never pauses on its own (the control plane does, first).
type CloseMode int

// Close modes.
const (
	// KeepSandboxes leaves running sandboxes running, for the next process
	// of this node to Recover (a restart or an upgrade loses nothing).
	KeepSandboxes CloseMode = iota
	// KillSandboxes kills every sandbox.
	KillSandboxes
)

func (n *Node) Close(ctx context.Context, mode CloseMode) error {
	n.mu.Lock()
	n.bgCancel()
	n.mu.Unlock()
	n.bgWork.Wait()
	errs := []error{n.pool.close(ctx)}
	if mode == KillSandboxes {
		for _, sb := range n.List() {
			if err := n.Kill(ctx, sb.ID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// Usage is a sandbox's resource use: memory now, and CPU time used since
// the previous reading (or since the sandbox was handed out).
type Usage struct {
	MemoryBytes   uint64
	CPUSinceNanos uint64
	Since         time.Time
}

// Usage reads a sandbox's resource use from the runtime.
func (n *Node) Usage(ctx context.Context, id string) (Usage, error) {
	sb, err := n.Get(id)
	if err != nil {
		return Usage{}, err
	}
	st, err := n.cfg.Runtime.Stats(ctx, sb.rt())
	if err != nil {
		return Usage{}, err
	}
	now := time.Now()
	n.mu.Lock()
	u := Usage{MemoryBytes: st.MemoryBytes, Since: sb.cpuAt}
	if st.CPUUsageNanos >= sb.cpuBase {
		u.CPUSinceNanos = st.CPUUsageNanos - sb.cpuBase
	}
	sb.cpuBase, sb.cpuAt = st.CPUUsageNanos, now
	n.mu.Unlock()
	return u, nil
}

func pick(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// NewID returns a random sandbox id.
func NewID() string { return ids.New() }

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
