package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/aenvhq/aenv/internal/runtime"
)

// mountDir is where COPY sources appear inside a step's sandbox; Run
// removes it from the tree before publishing.
const mountDir = ".aenv-build"

// Stepper runs build steps: the node's runtime driver (runtime.Stepper),
// so that builds run where and as sandboxes do.
type Stepper interface {
	RunStep(ctx context.Context, spec runtime.StepSpec, out io.Writer) (int, error)
}

// ServiceStarter is a Stepper that can also start a built template's
// service (its start command, gated by its ready check) ahead of its
// first sandbox: the build's last step when the template has one.
type ServiceStarter interface {
	StartService(ctx context.Context, templateID string, out io.Writer) error
}

// runner runs one build's steps through its Stepper, each writing
// straight into the staged root filesystem.
type runner struct {
	steps  Stepper
	limits Limits
	used   bool // some step mounted COPY sources
}

// runSpec is one command to run in the root filesystem.
type runSpec struct {
	argv, env []string
	cwd       string
	uid, gid  uint32
	// mounts are host paths bound read-only at /.aenv-build/srcN.
	mounts []string
}

func newRunner(opts Options) (*runner, error) {
	if opts.Steps == nil {
		return nil, errors.New("building: no step runner (this server runs no builds)")
	}
	return &runner{steps: opts.Steps, limits: opts.Limits}, nil
}

// run runs spec to completion over rootfs, its output going to out, and
// returns its exit code. A cancelled ctx kills it.
func (r *runner) run(ctx context.Context, rootfs string, spec runSpec, out io.Writer) (int, error) {
	binds := make([]runtime.Bind, len(spec.mounts))
	for i, m := range spec.mounts {
		binds[i] = runtime.Bind{Source: m, Destination: fmt.Sprintf("/%s/src%d", mountDir, i)}
	}
	if len(binds) > 0 {
		r.used = true
	}
	return r.steps.RunStep(ctx, runtime.StepSpec{
		RootFS: rootfs, Argv: spec.argv, Env: spec.env, Cwd: spec.cwd,
		UID: spec.uid, GID: spec.gid, Binds: binds,
		MemoryMB: r.limits.MemoryMB, CPUCount: r.limits.CPUCount, PidsLimit: r.limits.PidsLimit,
	}, out)
}

// removeMountPoints deletes the mount points that COPY steps left in the
// tree.
func (r *runner) removeMountPoints(rootfs string) error {
	if !r.used {
		return nil
	}
	p := filepath.Join(rootfs, mountDir)
	fi, err := os.Lstat(p)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return nil // the build made it something else: leave it
	}
	return os.RemoveAll(p)
}
