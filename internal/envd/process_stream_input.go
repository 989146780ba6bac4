package envd

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// StreamInput is SendInput as a client stream, which keeps the input's
// order: a start event naming the process, then data and keepalives.
func (ps *processService) StreamInput(_ context.Context, stream *connect.ClientStream[process.StreamInputRequest]) (*connect.Response[process.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *process.StreamInputRequest_Start:
			found, err := ps.s.procs.find(ev.Start.GetProcess())
			if err != nil {
				return nil, connectError(err)
			}
			p = found
		case *process.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("streaming input: %w: data before start", errInvalid))
			}
			if err := p.writeInput(inputBytes(ev.Data.GetInput())); err != nil {
				return nil, connectError(err)
			}
		case *process.StreamInputRequest_Keepalive:
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&process.StreamInputResponse{}), nil
}
