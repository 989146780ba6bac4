package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// Update resizes a process's pty.
func (ps *processService) Update(_ context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if req.Msg.Pty != nil {
		size := req.Msg.GetPty().GetSize()
		if err := p.resize(ptySize{cols: clampU16(size.GetCols(), 80), rows: clampU16(size.GetRows(), 24)}); err != nil {
			return nil, connectError(err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}
