package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
)

// List returns the processes envd started that are still running.
func (ps *processService) List(_ context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	res := &process.ListResponse{}
	for _, p := range ps.s.procs.list() {
		res.Processes = append(res.Processes, &process.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
	}
	return connect.NewResponse(res), nil
}
