package envd

import (
	"context"
	"fmt"
	"syscall"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// SendSignal delivers SIGTERM or SIGKILL to a process and its job. A
// process that is gone is not_found, which the SDK's kill() reports as
// false.
func (ps *processService) SendSignal(_ context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case process.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case process.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("sending signal: %w: unsupported signal %v", errInvalid, req.Msg.GetSignal()))
	}
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := p.signal(sig); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}
