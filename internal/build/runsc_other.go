//go:build !linux

package build

import (
	"context"
	"errors"
	"io"
)

var errUnsupported = errors.New("building templates needs Linux")

type runner struct{}

type runSpec struct {
	argv, env []string
	cwd       string
	uid, gid  uint32
	mounts    []string
}

func newRunner(opts Options) (*runner, error) { return nil, errUnsupported }

func (r *runner) run(ctx context.Context, rootfs string, spec runSpec, out io.Writer) (int, error) {
	return -1, errUnsupported
}

func (r *runner) removeMountPoints(rootfs string) error { return errUnsupported }

func (r *runner) close() {}
