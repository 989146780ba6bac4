package agent

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/node/nodeserver"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/proxy"
)

// NodeHandler serves what servers ask of this host's node, to holders of
// the cluster token only: the node API, the volumes' data plane, the
// node's metrics, and the sandbox traffic they forward (any other path).
// A node agent serves it on its own listener; a server with a local node
// serves it beside its API, so that the other servers reach its sandboxes.
func (h *Host) NodeHandler(token string, log *slog.Logger) http.Handler {
	return nodeapi.RequireToken(token, log, h.nodeHandler(log))
}

// nodeHandler is NodeHandler's mux, without its check of the caller.
func (h *Host) nodeHandler(log *slog.Logger) http.Handler {
	h.nodeMuxOnce.Do(func() { h.nodeMux = h.newNodeMux(log) })
	return h.nodeMux
}

func (h *Host) newNodeMux(log *slog.Logger) http.Handler {
	prx := proxy.New(localRoutes{h.node}, nil, log)
	// A sandbox that dies takes its connections with it: its network goes
	// without a reset, so they would otherwise hang. So does one that the
	// control plane stops here (its own proxy forgets it in its process,
	// not in this one).
	h.api.OnExit(prx.Forget)
	rpcPath, rpc := nodeapi.Handler(forgetOnStop{Local: h.api, forget: prx.Forget})
	mux := http.NewServeMux()
	mux.Handle(rpcPath, rpc)
	// Servers forward volumes' data plane here (after checking the
	// volume's token): the files are this node's.
	mux.Handle("/volumecontent/", h.volumes.Content())
	// The node's own figures (its warm pool, its block images), for the
	// cluster token's holders: a monitoring system scrapes each node. A
	// part that cannot be read (the image server restarting) leaves the
	// rest served.
	mux.Handle("GET /metrics", promhttp.HandlerFor(h.Metrics(), promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.Handle("/", prx)
	return mux
}

// forgetOnStop is the node API as the agent serves it: once a sandbox is
// killed or stopped by a snapshot (a pause, a migration), the agent's
// proxy closes its connections to it. Pooled by sandbox id, they would
// otherwise serve the sandbox's next stay on this node (a resume, a
// migration back), and hang on its old address, which nothing answers.
type forgetOnStop struct {
	*nodeserver.Local
	forget func(id, reason string)
}

func (f forgetOnStop) Kill(ctx context.Context, req *nodev1.KillRequest) (*nodev1.KillResponse, error) {
	resp, err := f.Local.Kill(ctx, req)
	if err == nil {
		f.forget(req.SandboxId, "")
	}
	return resp, err
}

func (f forgetOnStop) Snapshot(ctx context.Context, req *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	info, err := f.Local.Snapshot(ctx, req)
	if err == nil && req.Stop {
		f.forget(req.SandboxId, "")
	}
	return info, err
}

// localRoutes resolves the sandboxes of this host's node for its proxy.
type localRoutes struct{ n *node.Node }

func (l localRoutes) SandboxRoute(_ context.Context, id string) (proxy.Route, error) {
	sb, err := l.n.Get(id)
	if err != nil {
		return proxy.Route{}, err
	}
	return proxy.Route{Addr: sb.Addr}, nil
}
