package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/runtime/gvisor"
)

// MeasureSnapshot runs the snapshot suite on both halves: for each of
// opts.Sizes, a sandbox through the server (opts.Snapshots) and a bare
// runsc container of the same size, sampled in turn (measureSides); then
// what pausing opts.PauseCount small sandboxes frees. The bare half does
// with runsc alone what the server does: `runsc checkpoint
// --leave-running` (snapshot), `runsc checkpoint` + `runsc delete`
// (pause), `runsc restore --detach` (resume, and with `runsc exec
// true` the first command), a restore into a new container (create from a
// snapshot) and one checkpoint followed by N restores, two at a time
// (fork). Needs root. Every sandbox, snapshot, container, image, cgroup and
// mount it makes is removed before it returns, also on error.
func MeasureSnapshot(ctx context.Context, opts Options) (SnapshotResults, error) {
	opts = opts.withDefaults()
	if opts.Snapshots == nil {
		return SnapshotResults{}, errors.New("measuring snapshots: no API client")
	}
	return measureSnapshot(ctx, opts)
}

// MeasureBareSnapshot is the bare half of MeasureSnapshot alone, with
// containers sized by opts.CPUCount and opts.MemoryMB (or a size's own
// MemoryMB).
func MeasureBareSnapshot(ctx context.Context, opts Options) ([]SizeSamples, error) {
	opts.Snapshots = nil
	res, err := measureSnapshot(ctx, opts.withDefaults())
	return res.Bare, err
}

// measureSnapshot is MeasureSnapshot, without the aenv half when
// opts.Snapshots is nil.
func measureSnapshot(ctx context.Context, opts Options) (res SnapshotResults, err error) {
	withAenv := opts.Snapshots != nil
	r, err := newBareRunner(opts)
	if err != nil {
		return res, fmt.Errorf("measuring bare runsc snapshots: %w", err)
	}
	defer func() {
		if cerr := runCleanups(ctx, r.close); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleaning up bare runsc: %w", cerr))
		}
	}()
	p := newProgress(opts.Progress)
	for _, size := range opts.Sizes {
		a, b, err := measureBothSize(ctx, p, r, size)
		if err != nil {
			return res, fmt.Errorf("measuring snapshots, %s: %w", size.Name, err)
		}
		if withAenv {
			res.Aenv = append(res.Aenv, SizeSamples{Size: size, Samples: a})
		}
		res.Bare = append(res.Bare, SizeSamples{Size: size, Samples: b})
	}
	if withAenv {
		err = measureMemory(ctx, p, opts, &res)
	}
	return res, err
}

// measureBothSize measures one size on the bare half and, if the runner's
// options have an API, the aenv half, whose sandbox then sizes the bare
// container.
func measureBothSize(ctx context.Context, p *progress, r *bareRunner, size Size) (a, b SnapshotSamples, err error) {
	withAenv := r.opts.Snapshots != nil
	var sides []side
	// The bare container is sized like the aenv sandbox, else by opts.
	bopts := r.opts
	if size.MemoryMB > 0 {
		bopts.MemoryMB = size.MemoryMB
	}
	var as *aenvSide
	if withAenv {
		as, err = newAenvSide(ctx, p, r.opts, size)
		if err != nil {
			return a, b, err
		}
		defer func() {
			if kerr := runCleanups(ctx, as.kill); kerr != nil {
				err = errors.Join(err, kerr)
			}
		}()
		sides = append(sides, as)
		if as.cpus > 0 {
			bopts.CPUCount, bopts.MemoryMB = as.cpus, as.memoryMB
		}
	}
	bs, err := r.newSide(ctx, p, bopts, size)
	if err != nil {
		return a, b, err
	}
	defer func() {
		if cerr := runCleanups(ctx, r.remover(bs.id)); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	sides = append(sides, bs)
	out, err := measureSides(ctx, p, r.opts, size, sides)
	if withAenv {
		a = out[0]
		a.MemoryBytes = as.memoryBytes
	}
	b = out[len(out)-1]
	b.MemoryBytes = bs.memoryBytes
	return a, b, err
}

// bareSide is the bare half of the suite, on one container.
type bareSide struct {
	r    *bareRunner
	id   string
	opts Options
	args []string
	// memoryBytes is the container's cgroup usage once ready.
	memoryBytes int64
}

// newSide starts the container of size the bare half works on, sized by
// opts; the caller removes it.
func (r *bareRunner) newSide(ctx context.Context, p *progress, opts Options, size Size) (*bareSide, error) {
	b := &bareSide{r: r, opts: opts, args: r.initArgs(size.DirtyMiB)}
	p.start("runsc: starting "+size.Name, 1)
	id, err := r.start(ctx, b.opts, b.args)
	if err == nil && size.DirtyMiB > 0 {
		if err = r.waitDirty(ctx, id); err != nil {
			err = errors.Join(err, runCleanups(ctx, r.remover(id)))
		}
	}
	p.end()
	if err != nil {
		return nil, err
	}
	b.id = id
	b.memoryBytes, _ = cgroupMemory(r.opts.cgroupRoot, "", id)
	return b, nil
}

// snapshot times a leave-running checkpoint, then a restore of it into a
// new container and its first command.
func (b *bareSide) snapshot(ctx context.Context, res *SnapshotSamples) error {
	r := b.r
	img := r.image()
	start := time.Now()
	if err := r.checkpoint(ctx, b.id, img, "--leave-running"); err != nil {
		return errors.Join(err, runCleanups(ctx, imageRemover(img)))
	}
	res.Snapshot = append(res.Snapshot, time.Since(start))
	res.ImageBytes = dirSize(img)

	start = time.Now()
	child, del, err := r.restoreNew(ctx, b.opts, b.args, img)
	if err == nil {
		err = r.execTrue(ctx, child)
	}
	if err == nil {
		res.FromSnapshot = append(res.FromSnapshot, time.Since(start))
	}
	return errors.Join(err, runCleanups(ctx, del, imageRemover(img)))
}

// pauseResume times a checkpoint that stops the container and its delete,
// then a restore under the same id and bundle, as aenv resumes a sandbox
// under its id, and the first command.
func (b *bareSide) pauseResume(ctx context.Context, res *SnapshotSamples) (err error) {
	r, id := b.r, b.id
	img := r.image()
	defer func() {
		if cerr := runCleanups(ctx, imageRemover(img)); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	start, cpu := time.Now(), startCPU()
	if err := r.checkpoint(ctx, id, img); err != nil {
		return err
	}
	if err := r.runsc(ctx, filepath.Join(r.dir, id, "runsc.log"), "delete", "--force", id); err != nil {
		return err
	}
	res.Pause = append(res.Pause, time.Since(start))
	res.PauseCPU = cpu.sample(res.PauseCPU)
	start, cpu = time.Now(), startCPU()
	if err := r.restore(ctx, id, img); err != nil {
		return err
	}
	restored := time.Since(start)
	res.ResumeCPU = cpu.sample(res.ResumeCPU)
	if err := r.execTrue(ctx, id); err != nil {
		return err
	}
	res.Resume = append(res.Resume, restored)
	res.ResumeCommand = append(res.ResumeCommand, time.Since(start))
	d, err := r.restorePrepared(ctx, b.opts, b.args, img)
	if err != nil {
		return err
	}
	res.ResumePrepared = append(res.ResumePrepared, d)
	return nil
}

// restorePrepared creates a container of args with `runsc create`
// (its sandbox and gofer processes started, nothing run), untimed, then
// times a restore of img into it: what a resume would cost with such a
// container prepared ahead of it. It runs /bin/true in it to see it
// works, and deletes it.
func (r *bareRunner) restorePrepared(ctx context.Context, opts Options, args []string, img string) (_ time.Duration, err error) {
	id, dir, err := r.bundleWith(opts, args...)
	if err != nil {
		return 0, err
	}
	defer func() {
		if cerr := runCleanups(ctx, r.remover(id)); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	log := filepath.Join(dir, "runsc.log")
	if err := r.runsc(ctx, log, "create", "--bundle="+dir, id); err != nil {
		return 0, err
	}
	start := time.Now()
	if err := r.restore(ctx, id, img); err != nil {
		return 0, err
	}
	d := time.Since(start)
	return d, r.execTrue(ctx, id)
}

// fork times what the server's fork does with runsc: one checkpoint that
// leaves the container running, then count restores, as many at a time
// as the server runs (forkParallelism). The children and the image are
// removed (untimed) before it returns.
func (b *bareSide) fork(ctx context.Context, count int, res *SnapshotSamples) error {
	r := b.r
	img := r.image()
	start := time.Now()
	if err := r.checkpoint(ctx, b.id, img, "--leave-running"); err != nil {
		return errors.Join(err, runCleanups(ctx, imageRemover(img)))
	}
	dels := make([]cleanup, count)
	errs := make([]error, count)
	sem := make(chan struct{}, forkParallelism(count))
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			_, dels[i], errs[i] = r.restoreNew(ctx, b.opts, b.args, img)
		})
	}
	wg.Wait()
	d := time.Since(start)
	err := errors.Join(errs...)
	if err == nil {
		res.Fork[count] = append(res.Fork[count], d)
	}
	return errors.Join(err, runCleanups(ctx, append(dels, imageRemover(img))...))
}

// initArgs is the first process of a bare container: envd (or sleep when
// there is no envd), and for a dirty size the process holding its memory
// started beside it.
func (r *bareRunner) initArgs(dirtyMiB int) []string {
	init := []string{"/bin/sleep", "infinity"}
	if r.opts.EnvdPath != "" {
		init = []string{envdGuestPath, "--port", strconv.Itoa(envdPort)}
	}
	if dirtyMiB <= 0 {
		return init
	}
	// sh -c SCRIPT ARG0 ARGS...: the script is $0, envd's command line $@.
	return append([]string{"/bin/sh", "-c",
		`python3 -c "$0" </dev/null >/dev/null 2>&1 & exec "$@"`, dirtyScript(dirtyMiB)}, init...)
}

// envdPort is the port envd listens on in aenv's sandboxes.
const envdPort = 49983

// image returns a fresh directory path for a checkpoint image (runsc
// creates it).
func (r *bareRunner) image() string {
	return filepath.Join(r.dir, fmt.Sprintf("image-%d", r.seq.Add(1)))
}

// imageRemover returns the cleanup that deletes an image.
func imageRemover(dir string) cleanup {
	return func(context.Context) error { return os.RemoveAll(dir) }
}

// checkpoint saves container id into img, with runsc checkpoint's flags
// (e.g. --leave-running).
func (r *bareRunner) checkpoint(ctx context.Context, id, img string, flags ...string) error {
	args := append([]string{"checkpoint", "--image-path=" + img}, flags...)
	return r.runsc(ctx, filepath.Join(r.dir, id, "runsc.log"), append(args, id)...)
}

// restore starts container id of the bundle in r.dir/id from img, the way
// the driver restores.
func (r *bareRunner) restore(ctx context.Context, id, img string) error {
	dir := filepath.Join(r.dir, id)
	return r.runsc(ctx, filepath.Join(dir, "runsc.log"),
		"restore", "--detach", "--image-path="+img, "--bundle="+dir, id)
}

// execTrue runs /bin/true in container id.
func (r *bareRunner) execTrue(ctx context.Context, id string) error {
	return r.runsc(ctx, filepath.Join(r.dir, id, "exec.log"), "exec", id, "/bin/true")
}

// restoreNew restores img into a new container sized by opts and returns
// its id; the cleanup (also on error) deletes it.
func (r *bareRunner) restoreNew(ctx context.Context, opts Options, args []string, img string) (string, cleanup, error) {
	id, _, err := r.bundleWith(opts, args...)
	if err != nil {
		return "", nil, err
	}
	return id, r.remover(id), r.restore(ctx, id, img)
}

// start runs a detached container of args sized by opts.
func (r *bareRunner) start(ctx context.Context, opts Options, args []string) (string, error) {
	id, dir, err := r.bundleWith(opts, args...)
	if err != nil {
		return "", err
	}
	if err := r.runsc(ctx, filepath.Join(dir, "runsc.log"), "run", "--detach", "--bundle="+dir, id); err != nil {
		return "", errors.Join(err, runCleanups(ctx, r.remover(id)))
	}
	return id, nil
}

// waitDirty waits for the dirty process in container id to have written
// its memory.
func (r *bareRunner) waitDirty(ctx context.Context, id string) error {
	dir := filepath.Join(r.dir, id)
	err := poll(ctx, readyTimeout, func(ctx context.Context) (bool, error) {
		// A failed exec is `test` saying no; runsc failing shows as the
		// timeout, with the log's tail.
		return r.runsc(ctx, filepath.Join(dir, "exec.log"), "exec", id, "/bin/test", "-e", readyFile) == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%w%s", err, gvisor.TailLog(filepath.Join(dir, "runsc.log")))
	}
	return nil
}

// dirSize is the total size of the files under dir (0 if unreadable).
func dirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
