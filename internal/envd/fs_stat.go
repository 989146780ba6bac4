package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// Stat describes one path (a symlink itself, not its target).
func (fsvc *filesystemService) Stat(_ context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	u, db, err := fsvc.requestContext(req.Header())
	if err != nil {
		return nil, connectError(err)
	}
	e, err := statEntry(db, resolvePath(u, req.Msg.GetPath()))
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}
