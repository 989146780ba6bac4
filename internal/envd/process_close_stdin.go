package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// CloseStdin closes a process's stdin pipe so that it reads EOF. A pty has
// no such pipe: clients send Ctrl+D instead.
func (ps *processService) CloseStdin(_ context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := p.closeStdin(); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}
