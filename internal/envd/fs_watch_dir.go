package envd

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// WatchDir streams filesystem events under a directory: a start event once
// the watch is in place, then events named relative to the directory, with
// keepalives when asked for. The stream ends when the directory goes away.
func (fsvc *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	u, db, err := fsvc.requestContext(req.Header())
	if err != nil {
		return connectError(err)
	}
	m := req.Msg
	d, err := newDirWatcher(resolvePath(u, m.GetPath()), watchOptions{
		recursive:          m.GetRecursive(),
		includeEntry:       m.GetIncludeEntry(),
		allowNetworkMounts: m.GetAllowNetworkMounts(),
	}, db, fsvc.s.log)
	if err != nil {
		return connectError(err)
	}
	defer d.close()

	events := make(chan *filesystem.FilesystemEvent, 256)
	rootGone := make(chan struct{})
	go func() {
		defer close(rootGone)
		d.run(func(ev *filesystem.FilesystemEvent) {
			select {
			case events <- ev:
			case <-d.done:
			}
		})
	}()

	start := &filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}
	if err := stream.Send(start); err != nil {
		return err
	}
	ka, stop := keepalive(req.Header())
	defer stop()
	send := func(ev *filesystem.FilesystemEvent) error {
		return stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}})
	}
	for {
		select {
		case ev := <-events:
			if err := send(ev); err != nil {
				return err
			}
		case <-rootGone:
			for {
				select {
				case ev := <-events:
					if err := send(ev); err != nil {
						return err
					}
				default:
					return nil
				}
			}
		case <-ka:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("request timeout (Connect-Timeout-Ms) elapsed"))
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}
