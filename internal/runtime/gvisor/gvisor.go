// Package gvisor is the runtime driver for hosts without KVM: each sandbox is
// a gVisor sandbox started by the runsc binary (systrap platform), driven
// over its OCI command line through go-runc. The node agent's host wiring
// (package agent) picks it, and the benchmark drives bare runsc beside it.
package gvisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	runc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/runtime/cgroups"
	"github.com/aenvhq/aenv/internal/undo"
)

// Config configures the driver.
type Config struct {
	// RunscPath is the static runsc binary; empty means "runsc" from PATH.
	RunscPath string
	// StateDir holds runsc's state (--root) and one directory per sandbox
	// (its OCI bundle and logs). It is wiped of sandboxes on Cleanup.
	StateDir string
	// Platform is runsc's --platform; empty means systrap.
	Platform string
	// FastPath says whether systrap's spinning fast path is used; empty
	// means FastPathAuto (off on hosts of few CPUs).
	FastPath FastPath
	// CgroupParent is the cgroup under which each sandbox gets its own;
	// empty means /aenv. Servers sharing a host should differ. On cgroup
	// v2 it is under the cgroup the process was started in (its systemd
	// unit's, with Delegate=yes), which the process leaves for a leaf of
	// its own (cgroups.ServerLeaf).
	CgroupParent string
	// PidsTotal bounds the host tasks of all the driver's sandboxes
	// together (the pids cgroup CgroupParent); 0 means three quarters of
	// kernel.pid_max, so that sandboxes cannot take the host's last pids.
	PidsTotal int
	// Cgroups is the host's cgroup hierarchy; nil detects it (v1 or v2)
	// under /sys/fs/cgroup.
	Cgroups cgroups.Hierarchy
	// RootImages runs sandboxes whose root is an EROFS image file on this
	// host (runtime.RootFS.Image) without a gofer process when nothing
	// writable is bound in (see withoutGofer). It needs aenv's runsc
	// build (scripts/install-deps.sh), whose patch keeps their files on
	// disk, and mkfs.erofs.
	RootImages bool
	// ImagesDir holds the /.aenv images of sandboxes without a gofer;
	// empty means StateDir/images. It belongs on the file system of the
	// snapshots: each checkpoint keeps a hard link to its sandbox's image
	// (a copy across file systems), so that a later build of envd can
	// still restore it.
	ImagesDir string
	// Logger receives the driver's logs.
	Logger *slog.Logger
}

// Driver runs sandboxes with runsc. It is safe for concurrent use.
type Driver struct {
	cfg  Config
	runc *runc.Runc
	log  *slog.Logger
	// cg is the host's cgroup hierarchy, v1 or v2.
	cg cgroups.Hierarchy

	exits chan runtime.Exit
	// stopWatch ends watchExits, and watching is done when it has;
	// closeExits then closes exits, which only watchExits sends on.
	stopWatch  context.CancelFunc
	watching   sync.WaitGroup
	closeExits sync.Once

	mu sync.Mutex
	// running maps each sandbox to a pidfd of its sandbox process (-1 while
	// it starts), which tells without races against pid reuse when it dies.
	running map[string]int
	// pumps copy the sandboxes' envd output into their logs.
	pumps map[string]*logPump
	// fastPathFlags are runsc's flags for cfg.FastPath on this host.
	fastPathFlags []string
	// filestores are where each sandbox's overlay filestores were found
	// among its process's descriptors (see diskBytes).
	filestores map[string]filestoreFDs

	// serve runs restores, checkpoints and deletes without a runsc
	// process each; nil when runsc is not aenv's build with it
	// (serveEdit).
	serve *runscServer

	// rootImages is cfg.RootImages where mkfs.erofs is installed.
	rootImages bool
	// imageMu serialises the making of /.aenv images (toolsImage).
	imageMu sync.Mutex
}

// filestoreFDs are the /proc paths of the descriptors through which a
// sandbox process holds its unlinked overlay filestores.
type filestoreFDs struct {
	pid   int
	paths []string
}

var (
	_ runtime.Runtime      = (*Driver)(nil)
	_ runtime.ExitNotifier = (*Driver)(nil)
	_ runtime.Checkpointer = (*Driver)(nil)
	_ runtime.Recoverer    = (*Driver)(nil)
	_ runtime.LogReader    = (*Driver)(nil)
	_ runtime.Preparer     = (*Driver)(nil)
)

// exitPollInterval is how often the driver checks for sandboxes that died.
const exitPollInterval = time.Second

// New checks that runsc is usable and returns a driver.
func New(cfg Config) (*Driver, error) {
	if cfg.RunscPath == "" {
		p, err := exec.LookPath("runsc")
		if err != nil {
			return nil, fmt.Errorf("finding runsc: %w (install it with scripts/install-deps.sh)", err)
		}
		cfg.RunscPath = p
	}
	if _, err := os.Stat(cfg.RunscPath); err != nil {
		return nil, fmt.Errorf("checking runsc: %w", err)
	}
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.FastPath == "" {
		cfg.FastPath = FastPathAuto
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "/aenv"
	}
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "sandboxes"), 0o700); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	cg := cfg.Cgroups
	if cg == nil {
		var err error
		if cg, err = cgroups.Open(cgroups.Options{}); err != nil {
			return nil, err
		}
	}
	if err := limitPidsTotal(cg, cfg.CgroupParent, cfg.PidsTotal, cfg.Logger); err != nil {
		return nil, err
	}
	rootImages := cfg.RootImages
	if _, err := exec.LookPath("mkfs.erofs"); rootImages && err != nil {
		cfg.Logger.Warn("sandboxes run with a gofer: mkfs.erofs is not installed (apt-get install erofs-utils)")
		rootImages = false
	}
	edits, editsErr := runscEdits(cfg.RunscPath)
	if rootImages {
		if err := hasEdit(cfg.RunscPath, edits, editsErr, goferlessEdit); err != nil {
			cfg.Logger.Warn("sandboxes run with a gofer: without one a stock runsc keeps a sandbox's files in its memory", "err", err)
			rootImages = false
		}
	}
	d := &Driver{
		cfg:     cfg,
		cg:      cg,
		log:     cfg.Logger.With("runtime", "gvisor"),
		running: make(map[string]int),
		pumps:   make(map[string]*logPump),
		exits:   make(chan runtime.Exit, 1024),
		// The host's CPUs are read once: sandboxes and build steps alike
		// run with the flags they give.
		fastPathFlags: cfg.FastPath.Flags(cfg.Platform, goruntime.NumCPU()),
		filestores:    make(map[string]filestoreFDs),
		rootImages:    rootImages,
		runc: &runc.Runc{
			Command: cfg.RunscPath,
			Root:    filepath.Join(cfg.StateDir, "runsc"),
			// The sandbox must not receive the signals of our process group
			// (a Ctrl-C on the server would otherwise reach every sandbox).
			Setpgid: true,
			ExtraArgs: []string{
				"--platform=" + cfg.Platform,
				"--network=sandbox",
				"--cpu-num-from-quota",
				// The default user's passwordless sudo (as on E2B) needs
				// setuid binaries to elevate; root inside controls only its
				// own sandbox.
				"--allow-suid",
			},
		},
	}
	d.runc.ExtraArgs = append(d.runc.ExtraArgs, d.fastPathFlags...)
	if err := hasEdit(cfg.RunscPath, edits, editsErr, serveEdit); err == nil {
		d.serve = newRunscServer(cfg.RunscPath, append([]string{"--root=" + d.runc.Root}, d.runc.ExtraArgs...), cfg.StateDir, d.log)
	} else {
		d.log.Info("each restore, checkpoint and delete starts a runsc process", "err", err)
	}
	d.pruneToolsImages()
	ctx, cancel := context.WithCancel(context.Background())
	d.stopWatch = cancel
	d.watching.Add(1)
	go func() {
		defer d.watching.Done()
		d.watchExits(ctx)
	}()
	return d, nil
}

// Exits implements runtime.ExitNotifier. The channel is closed by Close,
// so that a reader's loop ends with the driver.
func (d *Driver) Exits() <-chan runtime.Exit { return d.exits }

// cgroup is the cgroup of sandbox (or step) id.
func (d *Driver) cgroup(id string) string { return path.Join(d.cfg.CgroupParent, id) }

// oomKilled reports whether the memory cgroup of sandbox id has killed a
// task for want of memory. It must be read before the sandbox is
// deleted, which removes the cgroup.
func (d *Driver) oomKilled(id string) bool {
	n, err := d.cg.OOMKills(d.cgroup(id))
	return err == nil && n > 0
}

// watchExits polls the pidfds of running sandboxes until ctx ends (the
// driver's Close); a pidfd becomes readable when its process exits.
// Polling all of them once a second costs one syscall per tick, where a
// blocking wait would cost a thread each.
func (d *Driver) watchExits(ctx context.Context) {
	t := time.NewTicker(exitPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.mu.Lock()
		var fds []unix.PollFd
		var ids []string
		for id, fd := range d.running {
			if fd >= 0 {
				fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
				ids = append(ids, id)
			}
		}
		d.mu.Unlock()
		if len(fds) == 0 {
			continue
		}
		if _, err := unix.Poll(fds, 0); err != nil {
			continue
		}
		for i, pfd := range fds {
			if pfd.Revents == 0 {
				continue
			}
			d.mu.Lock()
			fd, ok := d.running[ids[i]]
			// Kill may have taken the sandbox meanwhile.
			if ok && fd == int(pfd.Fd) {
				d.running[ids[i]] = -1
				unix.Close(fd)
			}
			d.mu.Unlock()
			if ok && fd == int(pfd.Fd) {
				ex := runtime.Exit{ID: ids[i], OutOfMemory: d.oomKilled(ids[i])}
				d.log.Warn("sandbox exited on its own", "sandbox_id", ids[i], "out_of_memory", ex.OutOfMemory)
				select {
				case d.exits <- ex:
				default:
					d.log.Error("exit queue full; dropping exit event", "sandbox_id", ids[i])
				}
			}
		}
	}
}

// Name implements runtime.Runtime.
func (d *Driver) Name() string { return "gvisor" }

// Capabilities implements runtime.Runtime.
func (d *Driver) Capabilities() runtime.Capabilities {
	return runtime.Capabilities{Pause: true, Checkpoint: true}
}

func (d *Driver) sandboxDir(id string) string {
	return filepath.Join(d.cfg.StateDir, "sandboxes", id)
}

// startMode is what start does once the bundle is written.
type startMode int

const (
	// startBoot runs the bundle's envd (runsc run).
	startBoot startMode = iota
	// startRestore restores a saved state (runsc restore).
	startRestore
	// startPrepare stops at a created container (runsc create), for
	// RestorePrepared.
	startPrepare
)

// Create implements runtime.Runtime.
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) error {
	return d.start(ctx, spec, startBoot, "")
}

// Restore implements runtime.Checkpointer.
func (d *Driver) Restore(ctx context.Context, spec runtime.Spec, imageDir string) error {
	return d.start(ctx, spec, startRestore, imageDir)
}

// Prepare implements runtime.Preparer with `runsc create`: the sandbox
// and gofer processes start, its cgroup, mounts and network namespace are
// set up, and envd's output goes to its log from then on (runsc hands the
// root container the stdio of its create, which a restore keeps).
func (d *Driver) Prepare(ctx context.Context, spec runtime.Spec) error {
	return d.start(ctx, spec, startPrepare, "")
}

// RestorePrepared implements runtime.Preparer: `runsc restore` of a
// created container loads the state into its sandbox process instead of
// starting one. Measured here, a small sandbox's restore took 58–88 ms
// against 142–188 ms for a restore that starts its own processes.
func (d *Driver) RestorePrepared(ctx context.Context, spec runtime.Spec, imageDir string) (err error) {
	d.mu.Lock()
	_, ok := d.running[spec.ID]
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("restoring into prepared %s: %w", spec.ID, runtime.ErrNotFound)
	}
	defer func() {
		if err != nil {
			if kerr := d.Kill(context.WithoutCancel(ctx), spec.ID); kerr != nil {
				d.log.Warn("removing a prepared sandbox whose restore failed", "sandbox_id", spec.ID, "err", kerr)
			}
		}
	}()
	dir := d.sandboxDir(spec.ID)
	recorded := recordedImage(dir)
	if !sameRootMode(recorded, imageDir) {
		return fmt.Errorf("restoring into prepared %s: %w", spec.ID, errOtherRootMode)
	}
	if image, tools, err := recordedTools(dir); err != nil {
		return fmt.Errorf("restoring into prepared %s: %w", spec.ID, err)
	} else if image != "" {
		if err := sameToolsImage(imageDir, tools); err != nil {
			return fmt.Errorf("restoring into prepared %s: %w", spec.ID, err)
		}
	}
	// The files bound into the guest are read by path when the restore
	// mounts them: the sandbox's own host name goes in now (a sandbox
	// without a gofer binds none).
	if recorded == "" {
		if err := WriteBundleFiles(dir, spec); err != nil {
			return fmt.Errorf("restoring into prepared %s: %w", spec.ID, err)
		}
	}
	// The pages file is read through the page cache, not with --direct
	// (O_DIRECT): a resume soon after its pause finds the image there,
	// still dirty, and O_DIRECT must first write it all back. Measured
	// here on a 256 MiB image: 0.35 s through the cache, 1.1 s with
	// --direct; from a cold cache 0.6-0.75 s and 0.6-1.0 s. (The
	// server's restores are without it too.)
	err = d.served(serveRequest{Op: "restore", ID: spec.ID, ImagePath: imageDir, Flags: []string{overlayFlag(dir, spec.DiskMB)}})
	if errors.Is(err, errNotSent) {
		r := d.runscIn(dir, spec.DiskMB)
		_, err = r.Restore(context.WithoutCancel(ctx), spec.ID, dir, &runc.RestoreOpts{
			CheckpointOpts: runc.CheckpointOpts{ImagePath: imageDir},
			Detach:         true,
		})
		if err != nil {
			err = fmt.Errorf("%w%s", err, TailLog(r.Log))
		}
	}
	if err != nil {
		return fmt.Errorf("restoring into prepared %s: %w", spec.ID, err)
	}
	d.log.Debug("sandbox restored into a prepared one", "sandbox_id", spec.ID, "hostname", hostname(spec))
	return nil
}

// runscIn is the runsc of a sandbox whose directory is dir: its log there,
// and its root filesystem's writes (see overlayFlag).
func (d *Driver) runscIn(dir string, diskMB int) *runc.Runc {
	r := *d.runc
	r.Log = filepath.Join(dir, "runsc.log")
	r.ExtraArgs = append(slices.Clone(r.ExtraArgs), overlayFlag(dir, diskMB))
	return &r
}

// Checkpoint implements runtime.Checkpointer. Without LeaveRunning runsc
// stops the sandbox once its state is saved; Kill then removes it.
func (d *Driver) Checkpoint(ctx context.Context, id, imageDir string, opts runtime.CheckpointOptions) error {
	d.mu.Lock()
	_, ok := d.running[id]
	d.mu.Unlock()
	if !ok {
		return fmt.Errorf("checkpointing %s: %w", id, runtime.ErrNotFound)
	}
	if opts.Freeze {
		opts.LeaveRunning = true
	}
	var actions []runc.CheckpointAction
	if opts.LeaveRunning {
		actions = append(actions, runc.LeaveRunning)
	}
	if opts.Freeze {
		// A paused container stays paused through a checkpoint that leaves
		// it running, so the saved state is exactly what it stopped at.
		if err := d.freeze(ctx, id); err != nil {
			return fmt.Errorf("checkpointing %s: %w%s", id, err, TailLog(filepath.Join(d.sandboxDir(id), "runsc.log")))
		}
	}
	err := d.served(serveRequest{Op: "checkpoint", ID: id, ImagePath: imageDir, LeaveRunning: opts.LeaveRunning})
	if errors.Is(err, errNotSent) {
		err = d.runc.Checkpoint(context.WithoutCancel(ctx), id, &runc.CheckpointOpts{ImagePath: imageDir}, actions...)
	}
	if err == nil {
		err = checkImage(imageDir)
	}
	if err == nil {
		err = markRootMode(d.sandboxDir(id), imageDir)
	}
	if err != nil {
		if opts.Freeze {
			if terr := d.Thaw(ctx, id); terr != nil {
				d.log.Warn("thawing a sandbox whose checkpoint failed", "sandbox_id", id, "err", terr)
			}
		}
		return fmt.Errorf("checkpointing %s: %w%s", id, err, TailLog(filepath.Join(d.sandboxDir(id), "runsc.log")))
	}
	if !opts.LeaveRunning {
		// The stop is ours: do not report it as a death.
		d.mu.Lock()
		if fd := d.running[id]; fd >= 0 {
			unix.Close(fd)
			d.running[id] = -1
		}
		d.mu.Unlock()
	}
	return nil
}

// imageFiles are what runsc writes for a checkpoint; a restore needs all.
var imageFiles = []string{"checkpoint.img", "pages_meta.img", "pages.img"}

// checkImage makes sure a checkpoint is complete before anything relies
// on it: every file runsc writes is there, and the state itself is not
// empty.
func checkImage(dir string) error {
	for _, name := range imageFiles {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("the checkpoint is incomplete: %w", err)
		}
		if name == "checkpoint.img" && fi.Size() == 0 {
			return errors.New("the checkpoint is incomplete: its state file is empty")
		}
	}
	return nil
}

// start runs a sandbox as mode says; imageDir is the state a restore
// loads.
func (d *Driver) start(ctx context.Context, spec runtime.Spec, mode startMode, imageDir string) (err error) {
	log := d.log.With("sandbox_id", spec.ID)
	dir := d.sandboxDir(spec.ID)
	var rollback undo.Stack
	defer func() {
		if err != nil {
			rollback.Run(context.WithoutCancel(ctx), log)
		}
	}()

	// Before the sandbox's directory exists: a first start may make the
	// /.aenv image, and a directory the running set does not name yet is
	// a leftover to Leftovers.
	toolsImage, err := d.rootMode(ctx, spec, mode, imageDir)
	if err != nil {
		return fmt.Errorf("starting %s: %w", spec.ID, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("creating sandbox dir %s: %w", spec.ID, err)
	}
	rollback.Push("removing sandbox dir", func(context.Context) error { return os.RemoveAll(dir) })

	if err := writeBundle(dir, spec, d.cg.Path(d.cgroup(spec.ID)), toolsImage); err != nil {
		return fmt.Errorf("writing bundle for %s: %w", spec.ID, err)
	}
	logFile, err := makeEnvdPipe(dir)
	if err != nil {
		return fmt.Errorf("starting %s: %w", spec.ID, err)
	}
	defer logFile.Close()

	d.mu.Lock()
	if _, dup := d.running[spec.ID]; dup {
		d.mu.Unlock()
		return fmt.Errorf("creating sandbox %s: id in use", spec.ID)
	}
	d.running[spec.ID] = -1
	d.mu.Unlock()
	rollback.Push("forgetting sandbox", func(context.Context) error {
		d.forget(spec.ID)
		return nil
	})
	if err := d.startPump(spec.ID); err != nil {
		return err
	}
	rollback.Push("stopping envd's log", func(context.Context) error {
		d.stopPump(spec.ID, 0)
		return nil
	})
	// Deleting is idempotent enough to register before run: a failed run can
	// leave runsc state behind that only delete removes.
	rollback.Push("deleting runsc container", func(ctx context.Context) error {
		return d.deleteContainer(ctx, spec.ID)
	})

	r := d.runscIn(dir, spec.DiskMB)
	// runsc must not be killed half-way through a start because the
	// caller gave up: that leaves sandbox processes runsc no longer knows.
	// The rollback removes a finished start instead.
	// The pid file saves a `runsc state` (a process start) per sandbox.
	pidFile := filepath.Join(dir, "pid")
	run := func() (err error) {
		switch mode {
		case startBoot:
			_, err = r.Run(context.WithoutCancel(ctx), spec.ID, dir, &runc.CreateOpts{
				Detach:  true,
				IO:      &fileIO{f: logFile},
				PidFile: pidFile,
			})
		case startPrepare:
			err = r.Create(context.WithoutCancel(ctx), spec.ID, dir, &runc.CreateOpts{
				IO:      &fileIO{f: logFile},
				PidFile: pidFile,
			})
		default:
			// Without --direct: see RestorePrepared.
			_, err = r.Restore(context.WithoutCancel(ctx), spec.ID, dir, &runc.RestoreOpts{
				CheckpointOpts: runc.CheckpointOpts{ImagePath: imageDir},
				Detach:         true,
				IO:             &fileIO{f: logFile},
				PidFile:        pidFile,
			})
		}
		return err
	}
	if spec.Prestarted {
		err = niced(run)
	} else {
		err = run()
	}
	if err != nil {
		return fmt.Errorf("starting runsc for %s: %w%s", spec.ID, err, TailLog(r.Log))
	}
	pid, err := readPid(pidFile)
	if err != nil {
		return fmt.Errorf("reading pid of %s: %w", spec.ID, err)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("watching sandbox process of %s: %w", spec.ID, err)
	}
	d.mu.Lock()
	d.running[spec.ID] = pidfd
	d.mu.Unlock()
	log.Debug("sandbox started", "pid", pid)
	return nil
}

// overlayFlag is where a sandbox's root filesystem writes go. The template
// tree is shared read-only; the writes go to an upper layer gVisor keeps
// in a file it creates (and unlinks) in the sandbox's directory, bounded
// by diskMB, so that files take disk and not memory and a full disk is
// ENOSPC for the writer. gVisor saves that layer in every checkpoint, so
// each restored copy gets its own. Without a size the layer is memory.
func overlayFlag(dir string, diskMB int) string {
	if diskMB <= 0 {
		return "--overlay2=root:memory"
	}
	return fmt.Sprintf("--overlay2=root:dir=%s,size=%dm", dir, diskMB)
}

// forget drops id from the running set, closing its pidfd.
func (d *Driver) forget(id string) (known bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fd, ok := d.running[id]
	if ok && fd >= 0 {
		unix.Close(fd)
	}
	delete(d.running, id)
	delete(d.filestores, id)
	return ok
}

// Kill implements runtime.Runtime.
func (d *Driver) Kill(ctx context.Context, id string) error {
	if !d.forget(id) && !d.isLeftover(ctx, id) {
		return fmt.Errorf("killing %s: %w", id, runtime.ErrNotFound)
	}
	// A kill that has begun must finish, whatever happens to its caller:
	// runsc stopped half-way leaves sandbox processes that nothing knows
	// of once their directory is gone.
	err := d.deleteContainer(context.WithoutCancel(ctx), id)
	d.stopPump(id, pumpDrainTimeout)
	if rmErr := os.RemoveAll(d.sandboxDir(id)); rmErr != nil && err == nil {
		err = rmErr
	}
	if err != nil {
		return fmt.Errorf("killing %s: %w", id, err)
	}
	return nil
}

// deleteContainer is `runsc delete --force id`, through the runsc server
// when there is one. A delete that server did not finish is run again by
// a runsc process: deleting what is half deleted is what --force does.
func (d *Driver) deleteContainer(ctx context.Context, id string) error {
	err := d.served(serveRequest{Op: "delete", ID: id})
	if !errors.Is(err, errNotSent) && !errors.Is(err, errNoAnswer) {
		return err
	}
	err = d.runc.Delete(ctx, id, &runc.DeleteOpts{Force: true})
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return nil
	}
	return err
}

// Foreground implements runtime.Foregrounder: a prestarted sandbox's
// cgroup, made by runsc at the lowest CPU weight (see resources), gets the
// default one, that of every sandbox in use.
func (d *Driver) Foreground(ctx context.Context, id string) error {
	if err := d.cg.SetCPUWeight(d.cgroup(id), cgroups.DefaultCPUWeight); err != nil {
		return fmt.Errorf("foregrounding sandbox %s: %w", id, err)
	}
	return nil
}

// Stats implements runtime.Runtime. It reads the sandbox's cgroup files
// directly: that costs microseconds where `runsc events --stats` costs a
// process start (and go-runc's reader of it races with its own Wait).
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	d.mu.Lock()
	_, ok := d.running[id]
	d.mu.Unlock()
	if !ok {
		return runtime.Stats{}, fmt.Errorf("reading stats of %s: %w", id, runtime.ErrNotFound)
	}
	cpu, err := d.cg.CPU(d.cgroup(id))
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("reading stats of %s: %w", id, err)
	}
	mem, err := d.cg.Memory(d.cgroup(id))
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("reading stats of %s: %w", id, err)
	}
	return runtime.Stats{CPUUsageNanos: uint64(cpu.Usage), MemoryBytes: mem, DiskBytes: d.diskBytes(id)}, nil
}

// diskBytes is the host disk the sandbox's files take: the blocks
// allocated to its overlay filestore, a sparse file runsc creates in the
// sandbox's directory and unlinks at once, so it is found through the
// sandbox process's descriptors. The sentry holds hundreds of them, and
// every sandbox's stats are read every few seconds, so where they were
// found is kept and only looked for again when the process or a
// descriptor changed.
func (d *Driver) diskBytes(id string) uint64 {
	dir := d.sandboxDir(id)
	pid, err := readPid(filepath.Join(dir, "pid"))
	if err != nil {
		return 0
	}
	prefix := filepath.Join(dir, "runsc-filestore")
	d.mu.Lock()
	known, ok := d.filestores[id]
	d.mu.Unlock()
	if ok && known.pid == pid {
		if total, ok := filestoreBytes(known.paths, prefix); ok {
			return total
		}
	}
	fds := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(fds)
	if err != nil {
		return 0
	}
	var paths []string
	for _, e := range entries {
		p := filepath.Join(fds, e.Name())
		if target, err := os.Readlink(p); err == nil && strings.HasPrefix(target, prefix) {
			paths = append(paths, p)
		}
	}
	total, _ := filestoreBytes(paths, prefix)
	d.mu.Lock()
	// None found may be a sandbox still starting, whose filestore comes
	// later: it is looked for again next time.
	if _, running := d.running[id]; running && len(paths) > 0 {
		d.filestores[id] = filestoreFDs{pid: pid, paths: paths}
	}
	d.mu.Unlock()
	return total
}

// filestoreBytes adds up the blocks of the files that the descriptor
// paths name; ok is false when one no longer names a file under prefix
// (closed, or its number reused).
func filestoreBytes(paths []string, prefix string) (total uint64, ok bool) {
	for _, p := range paths {
		var st unix.Stat_t
		if target, err := os.Readlink(p); err != nil || !strings.HasPrefix(target, prefix) || unix.Stat(p, &st) != nil {
			return 0, false
		}
		total += uint64(st.Blocks) * 512
	}
	return total, true
}

// ExportFiles implements runtime.FilesExporter with runsc's own export of
// a container's rootfs upper layer.
func (d *Driver) ExportFiles(ctx context.Context, id, path string) error {
	out, err := exec.CommandContext(ctx, d.cfg.RunscPath, "--root", d.runc.Root, "tar", "rootfs-upper", "--file", path, id).CombinedOutput()
	if err != nil {
		return fmt.Errorf("exporting the files of %s: %w: %s", id, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func readPid(p string) (int, error) {
	n, err := readUint(p)
	return int(n), err
}

func readUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// Leftovers implements runtime.Recoverer: the containers runsc knows under
// the driver's root and the sandbox directories, whichever exist (a crash
// mid-start can leave either without the other). Sandboxes this process
// runs are not leftovers.
func (d *Driver) Leftovers(ctx context.Context) ([]string, error) {
	list, err := d.runc.List(ctx)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listing leftover sandboxes: %w", err)
	}
	seen := map[string]bool{}
	var ids []string
	add := func(id string) {
		d.mu.Lock()
		_, ours := d.running[id]
		d.mu.Unlock()
		if !ours && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, c := range list {
		add(c.ID)
	}
	entries, err := os.ReadDir(filepath.Join(d.cfg.StateDir, "sandboxes"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listing leftover sandboxes: %w", err)
	}
	for _, e := range entries {
		add(e.Name())
	}
	return ids, nil
}

// isLeftover reports whether id is a sandbox of an earlier process that
// this one has not recovered.
func (d *Driver) isLeftover(ctx context.Context, id string) bool {
	if _, err := os.Stat(d.sandboxDir(id)); err == nil {
		return true
	}
	_, err := d.runc.State(ctx, id)
	return err == nil
}

// Recover implements runtime.Recoverer. The sandbox process is found by the
// pid file its start wrote and watched by a pidfd from then on, exactly as
// one this process started.
func (d *Driver) Recover(ctx context.Context, id string) error {
	st, err := d.runc.State(ctx, id)
	if err != nil {
		return fmt.Errorf("recovering %s: %w (%v)", id, runtime.ErrNotFound, err)
	}
	// Frozen by a pause whose server died before it finished: the state
	// it was saving may be incomplete, so the sandbox runs on. Servers
	// before the control-server freeze froze with `runsc pause`.
	switch {
	case st.Status == "running" && d.frozen(id):
		if err := d.Thaw(ctx, id); err != nil {
			return fmt.Errorf("recovering %s: %w", id, err)
		}
		d.log.Info("thawed a sandbox frozen by a pause cut short", "sandbox_id", id)
	case st.Status == "paused":
		if err := d.runc.Resume(context.WithoutCancel(ctx), id); err != nil {
			return fmt.Errorf("recovering %s: thawing it: %w", id, err)
		}
		d.log.Info("thawed a sandbox frozen by a pause cut short", "sandbox_id", id)
	case st.Status != "running":
		return fmt.Errorf("recovering %s: %w (runsc says %s)", id, runtime.ErrNotFound, st.Status)
	}
	pid, err := readPid(filepath.Join(d.sandboxDir(id), "pid"))
	if err != nil {
		pid = st.Pid
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("recovering %s: watching pid %d: %w (%v)", id, pid, runtime.ErrNotFound, err)
	}
	d.mu.Lock()
	if _, dup := d.running[id]; dup {
		d.mu.Unlock()
		unix.Close(pidfd)
		return fmt.Errorf("recovering %s: already running under this driver", id)
	}
	d.running[id] = pidfd
	d.mu.Unlock()
	if err := d.startPump(id); err != nil {
		d.log.Warn("envd's log is not kept", "sandbox_id", id, "err", err)
	}
	d.log.Info("sandbox recovered", "sandbox_id", id, "pid", pid)
	return nil
}

// Cleanup removes every sandbox a previous run of the driver left behind
// that this process has not recovered (after a crash the runsc state and
// sandbox processes may outlive us).
func (d *Driver) Cleanup(ctx context.Context) error {
	ids, err := d.Leftovers(ctx)
	if err != nil {
		d.log.Warn("listing leftover sandboxes", "err", err)
	}
	var errs []error
	for _, id := range ids {
		d.log.Info("removing leftover sandbox", "sandbox_id", id)
		if err := d.deleteContainer(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("deleting leftover %s: %w", id, err))
		}
		if err := os.RemoveAll(d.sandboxDir(id)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Close stops watching for exits (Exits gets no more) and copying the
// sandboxes' envd output (their FIFOs hold it for the next process), ends
// the runsc server once it has finished what it serves, and
// releases what runsc keeps for all sandboxes of the driver's root: it
// leaves a "null-netns" namespace mount there. While sandboxes still run
// (they outlive the process on a restart) it leaves that mount, which
// they share, for the next process.
func (d *Driver) Close() error {
	d.stopWatch()
	d.watching.Wait()
	d.closeExits.Do(func() { close(d.exits) })
	if d.serve != nil {
		d.serve.close()
	}
	d.mu.Lock()
	n := len(d.running)
	var pumps []string
	for id := range d.pumps {
		pumps = append(pumps, id)
	}
	d.mu.Unlock()
	// The sandboxes' FIFOs keep what they write for the next process.
	for _, id := range pumps {
		d.stopPump(id, 0)
	}
	if n > 0 {
		return nil
	}
	if err := unmountAll(filepath.Join(d.stepsRoot(), "null-netns")); err != nil {
		return err
	}
	return unmountAll(filepath.Join(d.runc.Root, "null-netns"))
}

// unmountAll peels every mount off p.
func unmountAll(p string) error {
	// runsc may have stacked several mounts there; peel them all.
	for range 1000 {
		err := unix.Unmount(p, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("unmounting %s: %w", p, err)
		}
	}
	return fmt.Errorf("unmounting %s: still mounted", p)
}

// TailLog returns the last lines of a runsc log file, prefixed for
// appending to an error, to make a failed runsc call explain itself; empty
// if there is nothing to show.
func TailLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return "\nrunsc log:\n" + strings.Join(lines, "\n")
}

// Version reports the runsc version ("runsc version X" as runsc prints
// it), so that snapshots can be restored only where the same runsc runs.
func (d *Driver) Version(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, d.cfg.RunscPath, "--version").Output()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(strings.TrimPrefix(line, "runsc version "))
}

// PidMaxWanted is the kernel.pid_max a host of sandboxes should have
// (scripts/install.sh and quickstart.sh raise it to this): every task in
// a sandbox is a host task too, and the kernel's default of 32,768 is a
// few busy sandboxes' worth.
const PidMaxWanted = 4194304

// limitPidsTotal sets the pids limit of the cgroup all sandboxes live in,
// warning where kernel.pid_max leaves them little room.
func limitPidsTotal(cg cgroups.Hierarchy, parent string, total int, log *slog.Logger) error {
	n, err := readUint("/proc/sys/kernel/pid_max")
	if err != nil {
		return fmt.Errorf("reading kernel.pid_max: %w", err)
	}
	if n < PidMaxWanted {
		log.Warn("kernel.pid_max is low for a host of sandboxes: a few fork-bombing sandboxes can take every pid the host has left; raise it with `sysctl -w kernel.pid_max=4194304` (scripts/install.sh does)",
			"pid_max", n, "wanted", PidMaxWanted)
	}
	if total <= 0 {
		total = int(n * 3 / 4)
	}
	if err := cg.Create(parent, cgroups.Limits{Pids: int64(total)}); err != nil {
		return fmt.Errorf("limiting the pids of all sandboxes to %d: %w", total, err)
	}
	return nil
}
