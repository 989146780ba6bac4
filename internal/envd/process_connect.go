package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// Connect attaches to a running process: start{pid}, then its further
// output and its end. Several clients may be attached at once; the request
// deadline ends only this stream, never the process.
func (ps *processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return connectError(err)
	}
	sub, err := p.subscribe()
	if err != nil {
		return connectError(err)
	}
	defer p.unsubscribe(sub)
	start := &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: p.pid}}}
	if err := stream.Send(&process.ConnectResponse{Event: start}); err != nil {
		return err
	}
	return forwardEvents(ctx, req.Header(), sub, func(ev *process.ProcessEvent) error {
		return stream.Send(&process.ConnectResponse{Event: ev})
	})
}
