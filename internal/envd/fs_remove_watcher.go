package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// RemoveWatcher stops a watcher made by CreateWatcher.
func (fsvc *filesystemService) RemoveWatcher(_ context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	if err := fsvc.s.watchers.remove(req.Msg.GetWatcherId()); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
