package envd

import (
	"context"
	"fmt"
	"os"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// Remove deletes a file, or a directory with everything in it.
func (fsvc *filesystemService) Remove(_ context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	// A login shell's start-up may read what this changes.
	defer fsvc.s.shells.changed(readyShellQuiet)
	u, err := fsvc.s.userFromHeader(req.Header())
	if err != nil {
		return nil, connectError(err)
	}
	p := resolvePath(u, req.Msg.GetPath())
	if _, err := os.Lstat(p); err != nil {
		return nil, connectError(fmt.Errorf("removing %s: %w", p, err))
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, connectError(fmt.Errorf("removing %s: %w", p, err))
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}
