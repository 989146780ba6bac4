package envd

import (
	"context"
	"fmt"
	"os"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// MakeDir creates a directory and its missing parents, owned by the user.
// An existing directory is already_exists (the SDK's makeDir returns false).
func (fsvc *filesystemService) MakeDir(_ context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	// A login shell's start-up may read what this changes.
	defer fsvc.s.shells.changed(readyShellQuiet)
	u, db, err := fsvc.requestContext(req.Header())
	if err != nil {
		return nil, connectError(err)
	}
	dir := resolvePath(u, req.Msg.GetPath())
	if fi, err := os.Stat(dir); err == nil {
		if fi.IsDir() {
			return nil, connectError(fmt.Errorf("creating directory %s: %w", dir, errAlreadyExists))
		}
		return nil, connectError(fmt.Errorf("creating directory %s: %w: a file exists there", dir, errInvalid))
	}
	created, err := mkdirAll(u, dir)
	if err != nil {
		return nil, connectError(err)
	}
	if !created {
		return nil, connectError(fmt.Errorf("creating directory %s: %w", dir, errAlreadyExists))
	}
	e, err := statEntry(db, dir)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}
