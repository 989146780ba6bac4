package envd

import (
	"context"
	"crypto/rand"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
)

// CreateWatcher starts a watch whose events are collected until fetched
// with GetWatcherEvents; it lives until RemoveWatcher.
func (fsvc *filesystemService) CreateWatcher(_ context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	u, db, err := fsvc.requestContext(req.Header())
	if err != nil {
		return nil, connectError(err)
	}
	m := req.Msg
	d, err := newDirWatcher(resolvePath(u, m.GetPath()), watchOptions{
		recursive:          m.GetRecursive(),
		includeEntry:       m.GetIncludeEntry(),
		allowNetworkMounts: m.GetAllowNetworkMounts(),
	}, db, fsvc.s.log)
	if err != nil {
		return nil, connectError(err)
	}
	pw := &polledWatcher{d: d}
	id := rand.Text()
	fsvc.s.watchers.add(id, pw)
	go d.run(pw.push)
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}
