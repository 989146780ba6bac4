package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/runtime/gvisor"
)

// MeasureBare measures the baseline: runsc started directly on
// opts.RootFS with the flags aenv's gVisor driver uses, except networking
// (--network=none: no namespace to prepare). Needs root. Every container it
// starts is deleted, and its temporary runsc root removed, before it
// returns.
func MeasureBare(ctx context.Context, opts Options) (_ BareResults, err error) {
	opts = opts.withDefaults()
	awaitQuiet(ctx, opts.Notes, opts.quietWithin, busyCores, "the bare runs")
	r, err := newBareRunner(opts)
	if err != nil {
		return BareResults{}, fmt.Errorf("measuring bare runsc: %w", err)
	}
	defer func() {
		if cerr := runCleanups(ctx, r.close); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up bare runsc: %w", cerr))
		}
	}()
	p := newProgress(opts.Progress)
	var res BareResults

	if _, c, err := r.runTrue(ctx); err != nil || c != nil {
		if err = errors.Join(err, runCleanups(ctx, c)); err != nil {
			return res, fmt.Errorf("measuring bare runsc: runsc run c=1: warm-up: %w", err)
		}
	}
	cpu := startCPU()
	if res.RunSerial, err = series(ctx, p, "runsc run c=1", 0, opts.Iterations, 1, r.runTrue); err != nil {
		return res, fmt.Errorf("measuring bare runsc: %w", err)
	}
	res.CPUPerRun = cpu.per(len(res.RunSerial))
	label := fmt.Sprintf("runsc run c=%d", opts.Concurrency)
	if res.RunConcurrent, err = series(ctx, p, label, 0, opts.rounds(), opts.Concurrency, r.runTrue); err != nil {
		return res, fmt.Errorf("measuring bare runsc: %w", err)
	}
	if opts.BurstSize > 0 {
		label := fmt.Sprintf("runsc run c=%d", opts.BurstSize)
		if res.Burst, err = series(ctx, p, label, 0, 1, opts.BurstSize, r.runTrue); err != nil {
			return res, fmt.Errorf("measuring bare runsc: %w", err)
		}
	}
	if opts.SustainFor > 0 {
		n, err := sustain(ctx, p, "sustained runsc run", opts.Concurrency, opts.SustainFor, r.runTrue)
		if err != nil {
			return res, fmt.Errorf("measuring bare runsc: %w", err)
		}
		res.RunsPerSecond = float64(n) / opts.SustainFor.Seconds()
	}

	id, err := r.startSleeper(ctx)
	if err != nil {
		return res, fmt.Errorf("measuring bare runsc: %w", err)
	}
	defer func() {
		if cerr := runCleanups(ctx, r.remover(id)); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	if res.Exec, err = series(ctx, p, "runsc exec", 1, opts.Iterations, 1, r.execer(id, "/bin/true")); err != nil {
		return res, fmt.Errorf("measuring bare runsc: %w", err)
	}
	if res.ExecShell, res.CPUPerExecShell, err = cpuSeries(ctx, p, "runsc exec bash -l", 1, opts.Iterations, commandSettle, r.execer(id, "/bin/bash", "-l", "-c", "true")); err != nil {
		return res, fmt.Errorf("measuring bare runsc: %w", err)
	}
	if res.ExecSpaced, err = series(ctx, p, "runsc exec, spaced", 0, opts.Iterations, 1, spaced(commandGap, r.execer(id, "/bin/true"))); err != nil {
		return res, fmt.Errorf("measuring bare runsc: %w", err)
	}
	return res, nil
}

// withBareRunner runs fn with a runner of opts, then deletes every
// container it left and its runsc root; failures are errors of what.
func withBareRunner(ctx context.Context, opts Options, what string, fn func(*bareRunner) error) error {
	r, err := newBareRunner(opts)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	err = fn(r)
	if cerr := runCleanups(ctx, r.close); cerr != nil {
		err = errors.Join(err, fmt.Errorf("cleaning up bare runsc: %w", cerr))
	}
	return err
}

// bareRunner starts containers with runsc under a private --root.
type bareRunner struct {
	opts Options
	// fastPath is opts.FastPath parsed.
	fastPath gvisor.FastPath
	// dir holds the runsc root and one bundle per container.
	dir    string
	prefix string
	seq    atomic.Int64
}

// CheckBare reports whether MeasureBare can run with opts: as root, with
// the runsc binary and a root filesystem that has /bin/true and /bin/bash.
// It lets a caller fail before spending minutes on the aenv half.
func CheckBare(opts Options) error {
	if os.Geteuid() != 0 {
		return errors.New("checking bare runsc: needs root")
	}
	if opts.RunscPath == "" {
		if _, err := exec.LookPath("runsc"); err != nil {
			return fmt.Errorf("checking bare runsc: %w", err)
		}
	}
	if _, err := gvisor.ParseFastPath(opts.FastPath); err != nil {
		return fmt.Errorf("checking bare runsc: %w", err)
	}
	for _, p := range []string{opts.RunscPath, opts.EnvdPath, filepath.Join(opts.RootFS, "bin/true"), filepath.Join(opts.RootFS, "bin/bash")} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("checking bare runsc: %w", err)
		}
	}
	return nil
}

func newBareRunner(opts Options) (*bareRunner, error) {
	if err := CheckBare(opts); err != nil {
		return nil, err
	}
	if opts.RunscPath == "" {
		opts.RunscPath, _ = exec.LookPath("runsc")
	}
	// runsc reads a bundle's relative paths (the root, a mount's source)
	// from the bundle's directory, not from ours: `--envd bin/envd`
	// failed every bare start with the sentry's "error reading mounts
	// file".
	for _, p := range []*string{&opts.RootFS, &opts.EnvdPath} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, fmt.Errorf("checking bare runsc: %w", err)
		}
		*p = abs
	}
	dir, err := os.MkdirTemp("", "aenv-bench-")
	if err != nil {
		return nil, fmt.Errorf("creating runsc root: %w", err)
	}
	if err := os.Mkdir(filepath.Join(dir, "root"), 0o700); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("creating runsc root: %w", err)
	}
	fp, _ := gvisor.ParseFastPath(opts.FastPath) // checked by CheckBare
	return &bareRunner{opts: opts, fastPath: fp, dir: dir, prefix: fmt.Sprintf("aenv-bench-%d-", os.Getpid())}, nil
}

// args returns runsc's command line: the global flags of aenv's gVisor
// driver (internal/runtime/gvisor) with networking off, then sub.
func (r *bareRunner) args(sub ...string) []string {
	args := append([]string{
		"--root=" + filepath.Join(r.dir, "root"),
		"--platform=systrap",
		"--network=none",
		"--overlay2=root:memory",
		"--cpu-num-from-quota",
	}, r.fastPath.Flags("systrap", goruntime.NumCPU())...)
	return append(args, sub...)
}

// runsc runs runsc with args, its output going to logPath; on failure the
// error carries the log's tail.
func (r *bareRunner) runsc(ctx context.Context, logPath string, args ...string) error {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, r.opts.RunscPath, r.args(args...)...)
	// Files, not pipes: a detached sandbox inherits them and would hold a
	// pipe open forever. Own process group: a Ctrl-C on the benchmark must
	// leave the sandboxes to the cleanup rather than kill them half-way.
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// On cancel, ask runsc to stop (it passes the signal to the container
	// and tears down what it built) rather than kill it half-way through
	// creating a sandbox; kill only if it does not stop.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("runsc %s: %w%s", args[0], err, gvisor.TailLog(logPath))
	}
	return nil
}

// bundle writes a fresh container's OCI bundle running args and returns the
// container's id and bundle directory.
func (r *bareRunner) bundle(args ...string) (id, dir string, err error) {
	return r.bundleWith(r.opts, args...)
}

// bundleWith is bundle with opts' size and envd instead of the runner's.
func (r *bareRunner) bundleWith(opts Options, args ...string) (id, dir string, err error) {
	id = r.nextID()
	dir = filepath.Join(r.dir, id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("writing bundle %s: %w", id, err)
	}
	if err := writeBareBundle(dir, id, opts, args); err != nil {
		return "", "", fmt.Errorf("writing bundle %s: %w", id, err)
	}
	return id, dir, nil
}

// nextID is a fresh container id. The numbers are of one width because
// runsc takes an id's unique prefix for the id: with -1 and -10..-19
// alive, `runsc delete ...-1` is refused as ambiguous.
func (r *bareRunner) nextID() string {
	return fmt.Sprintf("%s%06d", r.prefix, r.seq.Add(1))
}

// remover returns the cleanup that deletes container id and its bundle.
func (r *bareRunner) remover(id string) cleanup {
	return func(ctx context.Context) error {
		dir := filepath.Join(r.dir, id)
		err := r.runsc(ctx, filepath.Join(dir, "delete.log"), "delete", "--force", id)
		if err != nil && strings.Contains(err.Error(), "does not exist") {
			err = nil // `runsc run` without --detach deletes on exit.
		}
		// A runsc killed while creating the container can leave its cgroup
		// behind with nothing in it.
		// (v1: one per controller; v2: one in the unified tree.)
		cgroups, _ := filepath.Glob("/sys/fs/cgroup/*/" + id)
		if _, err := os.Stat("/sys/fs/cgroup/" + id); err == nil {
			cgroups = append(cgroups, "/sys/fs/cgroup/"+id)
		}
		for _, c := range cgroups {
			if rmErr := unix.Rmdir(c); rmErr != nil && err == nil {
				err = fmt.Errorf("removing cgroup %s: %w", c, rmErr)
			}
		}
		if rmErr := os.RemoveAll(dir); err == nil {
			err = rmErr
		}
		if err != nil {
			return fmt.Errorf("deleting container %s: %w", id, err)
		}
		return nil
	}
}

// runTrue times `runsc run` of /bin/true in a fresh container, from start to
// exit.
func (r *bareRunner) runTrue(ctx context.Context) (time.Duration, cleanup, error) {
	id, dir, err := r.bundle("/bin/true")
	if err != nil {
		return 0, nil, err
	}
	start := time.Now()
	err = r.runsc(ctx, filepath.Join(dir, "runsc.log"), "run", "--bundle="+dir, id)
	return time.Since(start), r.remover(id), err
}

// startSleeper starts a detached container that sleeps until deleted.
func (r *bareRunner) startSleeper(ctx context.Context) (string, error) {
	id, dir, err := r.bundle("/bin/sleep", "infinity")
	if err != nil {
		return "", err
	}
	if err := r.runsc(ctx, filepath.Join(dir, "runsc.log"), "run", "--detach", "--bundle="+dir, id); err != nil {
		return "", errors.Join(err, runCleanups(ctx, r.remover(id)))
	}
	return id, nil
}

// execer returns an op timing `runsc exec` of args in container id.
func (r *bareRunner) execer(id string, args ...string) op {
	logPath := filepath.Join(r.dir, id, "exec.log")
	return func(ctx context.Context) (time.Duration, cleanup, error) {
		start := time.Now()
		err := r.runsc(ctx, logPath, append([]string{"exec", id}, args...)...)
		return time.Since(start), nil, err
	}
}

// close deletes every container still in the private root, unmounts what
// runsc left mounted there (its null-netns) and removes the directory.
func (r *bareRunner) close(ctx context.Context) error {
	var errs []error
	entries, _ := os.ReadDir(r.dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), r.prefix) {
			errs = append(errs, r.remover(e.Name())(ctx))
		}
	}
	mounts, err := mountsUnder(r.dir)
	if err != nil {
		errs = append(errs, err)
	}
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
		}
	}
	if err := os.RemoveAll(r.dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mountsUnder lists this process's mount points below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		// mountinfo escapes space, tab, newline and backslash as octal;
		// our own temp paths contain none of them.
		if mp := fields[4]; strings.HasPrefix(mp, dir+"/") {
			out = append([]string{mp}, out...)
		}
	}
	return out, sc.Err()
}

// envdGuestPath is where the driver mounts envd in every sandbox.
const envdGuestPath = gvisor.EnvdGuestPath

// writeBareBundle writes config.json for a container running args, shaped
// exactly like the driver's bundles (gvisor.OCISpec: same mounts, envd's
// binary only when opts.EnvdPath is set, capabilities, rlimits, namespaces
// and cgroup limits), so that bare and aenv sandboxes do the same start-up
// work; only the network namespace is a fresh empty one.
func writeBareBundle(dir, id string, opts Options, args []string) error {
	spec := runtime.Spec{
		ID: id, Root: runtime.RootFS{Dir: opts.RootFS}, EnvdPath: opts.EnvdPath,
		CPUCount: opts.CPUCount, MemoryMB: opts.MemoryMB,
	}
	if err := gvisor.WriteBundleFiles(dir, spec); err != nil {
		return err
	}
	// One cgroup level, unlike the driver's /<parent>/<id>: runsc removes
	// the container's cgroup on delete but not a parent it created.
	s := gvisor.OCISpec(dir, spec, "/"+id)
	s.Process.Args = args
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
}
