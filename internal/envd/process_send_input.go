package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// SendInput writes to a process's stdin or pty. Either kind of input goes
// to whichever the process has.
func (ps *processService) SendInput(_ context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	p, err := ps.s.procs.find(req.Msg.GetProcess())
	if err != nil {
		return nil, connectError(err)
	}
	if err := p.writeInput(inputBytes(req.Msg.GetInput())); err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

func inputBytes(in *process.ProcessInput) []byte {
	switch v := in.GetInput().(type) {
	case *process.ProcessInput_Stdin:
		return v.Stdin
	case *process.ProcessInput_Pty:
		return v.Pty
	default:
		return nil
	}
}
