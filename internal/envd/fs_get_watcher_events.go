package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// GetWatcherEvents returns and forgets the events a watcher collected since
// the last call.
func (fsvc *filesystemService) GetWatcherEvents(_ context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	pw, err := fsvc.s.watchers.get(req.Msg.GetWatcherId())
	if err != nil {
		return nil, connectError(err)
	}
	evs, dropped := pw.take()
	if dropped > 0 {
		fsvc.s.log.Warn("watcher dropped events nobody fetched", "watcher_id", req.Msg.GetWatcherId(), "dropped", dropped)
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}
