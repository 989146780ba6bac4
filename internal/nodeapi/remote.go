package nodeapi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1/nodev1connect"
)

// Handler serves n's node API (the node agent's side); mount it behind
// RequireToken.
func Handler(n Node) (string, http.Handler) {
	return nodev1connect.NewNodeServiceHandler(&handler{n: n})
}

// handler adapts a Node to the generated handler interface: they differ
// only in how the event stream is written.
type handler struct{ n Node }

func (h *handler) Info(ctx context.Context, r *nodev1.InfoRequest) (*nodev1.NodeInfo, error) {
	return served(h.n.Info(ctx, r))
}

func (h *handler) Create(ctx context.Context, r *nodev1.CreateRequest) (*nodev1.Sandbox, error) {
	return served(h.n.Create(ctx, r))
}

func (h *handler) Kill(ctx context.Context, r *nodev1.KillRequest) (*nodev1.KillResponse, error) {
	return served(h.n.Kill(ctx, r))
}

func (h *handler) List(ctx context.Context, r *nodev1.ListRequest) (*nodev1.ListResponse, error) {
	return served(h.n.List(ctx, r))
}

func (h *handler) Snapshot(ctx context.Context, r *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	return served(h.n.Snapshot(ctx, r))
}

func (h *handler) Stats(ctx context.Context, r *nodev1.StatsRequest) (*nodev1.SandboxStats, error) {
	return served(h.n.Stats(ctx, r))
}

func (h *handler) ListSnapshots(ctx context.Context, r *nodev1.ListSnapshotsRequest) (*nodev1.ListSnapshotsResponse, error) {
	return served(h.n.ListSnapshots(ctx, r))
}

func (h *handler) GetSnapshot(ctx context.Context, r *nodev1.GetSnapshotRequest) (*nodev1.SnapshotInfo, error) {
	return served(h.n.GetSnapshot(ctx, r))
}

func (h *handler) DeleteSnapshot(ctx context.Context, r *nodev1.DeleteSnapshotRequest) (*nodev1.DeleteSnapshotResponse, error) {
	return served(h.n.DeleteSnapshot(ctx, r))
}

func (h *handler) ExportVolume(ctx context.Context, r *nodev1.ExportVolumeRequest) (*nodev1.ExportVolumeResponse, error) {
	return served(h.n.ExportVolume(ctx, r))
}

func (h *handler) ImportVolume(ctx context.Context, r *nodev1.ImportVolumeRequest) (*nodev1.ImportVolumeResponse, error) {
	return served(h.n.ImportVolume(ctx, r))
}

func (h *handler) UpdateNetwork(ctx context.Context, r *nodev1.UpdateNetworkRequest) (*nodev1.UpdateNetworkResponse, error) {
	return served(h.n.UpdateNetwork(ctx, r))
}

func (h *handler) CreateVolume(ctx context.Context, r *nodev1.CreateVolumeRequest) (*nodev1.CreateVolumeResponse, error) {
	return served(h.n.CreateVolume(ctx, r))
}

func (h *handler) DeleteVolume(ctx context.Context, r *nodev1.DeleteVolumeRequest) (*nodev1.DeleteVolumeResponse, error) {
	return served(h.n.DeleteVolume(ctx, r))
}

func (h *handler) Logs(ctx context.Context, r *nodev1.LogsRequest) (*nodev1.LogsResponse, error) {
	return served(h.n.Logs(ctx, r))
}

func (h *handler) Metrics(ctx context.Context, r *nodev1.MetricsRequest) (*nodev1.MetricsResponse, error) {
	return served(h.n.Metrics(ctx, r))
}

func (h *handler) Events(ctx context.Context, _ *nodev1.EventsRequest, st *connect.ServerStream[nodev1.Event]) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sendErr error
	err := h.n.Events(ctx, func(ev *nodev1.Event) {
		if sendErr == nil {
			if sendErr = st.Send(ev); sendErr != nil {
				cancel()
			}
		}
	})
	if sendErr != nil {
		return sendErr
	}
	return toWire(err)
}

func (h *handler) PutBuildContext(ctx context.Context, r *nodev1.PutBuildContextRequest) (*nodev1.PutBuildContextResponse, error) {
	return h.n.PutBuildContext(ctx, r)
}

func (h *handler) Build(ctx context.Context, r *nodev1.BuildRequest, st *connect.ServerStream[nodev1.BuildEvent]) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sendErr error
	err := h.n.Build(ctx, r, func(ev *nodev1.BuildEvent) {
		if sendErr == nil {
			if sendErr = st.Send(ev); sendErr != nil {
				cancel() // the caller is gone: so is its build
			}
		}
	})
	if sendErr != nil {
		return sendErr
	}
	return err
}

func (h *handler) Pull(ctx context.Context, r *nodev1.PullRequest, st *connect.ServerStream[nodev1.PullEvent]) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var sendErr error
	err := h.n.Pull(ctx, r, func(ev *nodev1.PullEvent) {
		if sendErr == nil {
			if sendErr = st.Send(ev); sendErr != nil {
				cancel() // the caller is gone: so is its pull
			}
		}
	})
	if sendErr != nil {
		return sendErr
	}
	return err
}

func (h *handler) ExportSnapshot(ctx context.Context, r *nodev1.ExportSnapshotRequest, st *connect.ServerStream[nodev1.SnapshotPart]) error {
	return toWire(h.n.ExportSnapshot(ctx, r, st.Send))
}

func (h *handler) ImportSnapshot(ctx context.Context, r *nodev1.ImportSnapshotRequest) (*nodev1.ImportSnapshotResponse, error) {
	return served(h.n.ImportSnapshot(ctx, r))
}

// Remote is the node API of a node agent across the network.
type Remote struct {
	id string
	c  nodev1connect.NodeServiceClient
}

// Transport is the HTTP transport for node API calls and for sandbox
// traffic to nodes: short dial timeouts and TCP keepalives, so that a
// node that vanished is noticed within seconds, and every request
// carrying token.
func Transport(token string) http.RoundTripper {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 5 * time.Second}
	return &tokenTransport{token: token, rt: &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}}
}

type tokenTransport struct {
	token string
	rt    http.RoundTripper
}

// CloseIdleConnections closes the idle connections of the transport
// underneath (http.Client.CloseIdleConnections calls it).
func (t *tokenTransport) CloseIdleConnections() {
	if c, ok := t.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

func (t *tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(TokenHeader, t.token)
	return t.rt.RoundTrip(r)
}

// Dial returns the node API of node id at address (host:port), calling
// through rt (see Transport).
func Dial(id, address string, rt http.RoundTripper) *Remote {
	return &Remote{id: id, c: nodev1connect.NewNodeServiceClient(&http.Client{Transport: rt}, "http://"+address)}
}

// ID implements Node.
func (r *Remote) ID() string { return r.id }

// Info implements Node.
func (r *Remote) Info(ctx context.Context, q *nodev1.InfoRequest) (*nodev1.NodeInfo, error) {
	return fromWire(r.c.Info(ctx, q))
}

// Create implements Node.
func (r *Remote) Create(ctx context.Context, q *nodev1.CreateRequest) (*nodev1.Sandbox, error) {
	return fromWire(r.c.Create(ctx, q))
}

// Kill implements Node.
func (r *Remote) Kill(ctx context.Context, q *nodev1.KillRequest) (*nodev1.KillResponse, error) {
	return fromWire(r.c.Kill(ctx, q))
}

// List implements Node.
func (r *Remote) List(ctx context.Context, q *nodev1.ListRequest) (*nodev1.ListResponse, error) {
	return fromWire(r.c.List(ctx, q))
}

// Snapshot implements Node.
func (r *Remote) Snapshot(ctx context.Context, q *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	return fromWire(r.c.Snapshot(ctx, q))
}

// Stats implements Node.
func (r *Remote) Stats(ctx context.Context, q *nodev1.StatsRequest) (*nodev1.SandboxStats, error) {
	return fromWire(r.c.Stats(ctx, q))
}

// ListSnapshots implements Node.
func (r *Remote) ListSnapshots(ctx context.Context, q *nodev1.ListSnapshotsRequest) (*nodev1.ListSnapshotsResponse, error) {
	return fromWire(r.c.ListSnapshots(ctx, q))
}

// GetSnapshot implements Node.
func (r *Remote) GetSnapshot(ctx context.Context, q *nodev1.GetSnapshotRequest) (*nodev1.SnapshotInfo, error) {
	return fromWire(r.c.GetSnapshot(ctx, q))
}

// DeleteSnapshot implements Node.
func (r *Remote) DeleteSnapshot(ctx context.Context, q *nodev1.DeleteSnapshotRequest) (*nodev1.DeleteSnapshotResponse, error) {
	return fromWire(r.c.DeleteSnapshot(ctx, q))
}

// ExportVolume implements Node.
func (r *Remote) ExportVolume(ctx context.Context, q *nodev1.ExportVolumeRequest) (*nodev1.ExportVolumeResponse, error) {
	return fromWire(r.c.ExportVolume(ctx, q))
}

// ImportVolume implements Node.
func (r *Remote) ImportVolume(ctx context.Context, q *nodev1.ImportVolumeRequest) (*nodev1.ImportVolumeResponse, error) {
	return fromWire(r.c.ImportVolume(ctx, q))
}

// UpdateNetwork implements Node.
func (r *Remote) UpdateNetwork(ctx context.Context, q *nodev1.UpdateNetworkRequest) (*nodev1.UpdateNetworkResponse, error) {
	return fromWire(r.c.UpdateNetwork(ctx, q))
}

// CreateVolume implements Node.
func (r *Remote) CreateVolume(ctx context.Context, q *nodev1.CreateVolumeRequest) (*nodev1.CreateVolumeResponse, error) {
	return fromWire(r.c.CreateVolume(ctx, q))
}

// DeleteVolume implements Node.
func (r *Remote) DeleteVolume(ctx context.Context, q *nodev1.DeleteVolumeRequest) (*nodev1.DeleteVolumeResponse, error) {
	return fromWire(r.c.DeleteVolume(ctx, q))
}

// Logs implements Node.
func (r *Remote) Logs(ctx context.Context, q *nodev1.LogsRequest) (*nodev1.LogsResponse, error) {
	return fromWire(r.c.Logs(ctx, q))
}

// Metrics implements Node.
func (r *Remote) Metrics(ctx context.Context, q *nodev1.MetricsRequest) (*nodev1.MetricsResponse, error) {
	return fromWire(r.c.Metrics(ctx, q))
}

// Events implements Node.
func (r *Remote) Events(ctx context.Context, fn func(*nodev1.Event)) error {
	st, err := r.c.Events(ctx, &nodev1.EventsRequest{})
	if err != nil {
		return classify(err)
	}
	defer st.Close()
	for st.Receive() {
		fn(st.Msg())
	}
	if ctx.Err() != nil {
		return nil
	}
	return classify(st.Err())
}

// PutBuildContext implements Node.
func (r *Remote) PutBuildContext(ctx context.Context, q *nodev1.PutBuildContextRequest) (*nodev1.PutBuildContextResponse, error) {
	return r.c.PutBuildContext(ctx, q)
}

// Build implements Node.
func (r *Remote) Build(ctx context.Context, q *nodev1.BuildRequest, fn func(*nodev1.BuildEvent)) error {
	st, err := r.c.Build(ctx, q)
	if err != nil {
		return err
	}
	return follow(st, "build", fn, func(ev *nodev1.BuildEvent) bool { return ev.Result != nil })
}

// Pull implements Node.
func (r *Remote) Pull(ctx context.Context, q *nodev1.PullRequest, fn func(*nodev1.PullEvent)) error {
	st, err := r.c.Pull(ctx, q)
	if err != nil {
		return err
	}
	return follow(st, "pull", fn, func(ev *nodev1.PullEvent) bool { return ev.Result != nil })
}

// follow passes a job's stream to fn and insists that it ends with the
// job's result (last says which event that is): a stream cut short is
// Unavailable, not a job that ended well.
func follow[T any](st *connect.ServerStreamForClient[T], what string, fn func(*T), last func(*T) bool) error {
	defer st.Close()
	done := false
	for st.Receive() {
		ev := st.Msg()
		done = done || last(ev)
		fn(ev)
	}
	if err := st.Err(); err != nil {
		return err
	}
	if !done {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the %s's stream ended without its result", what))
	}
	return nil
}

// ExportSnapshot implements Node.
func (r *Remote) ExportSnapshot(ctx context.Context, q *nodev1.ExportSnapshotRequest, fn func(*nodev1.SnapshotPart) error) error {
	st, err := r.c.ExportSnapshot(ctx, q)
	if err != nil {
		return classify(err)
	}
	defer st.Close()
	for st.Receive() {
		part := st.Msg()
		if err := fn(part); err != nil {
			return err
		}
		if part.Last {
			return nil
		}
	}
	if err := st.Err(); err != nil {
		return classify(err)
	}
	return NewError(connect.CodeUnavailable, fmt.Errorf("exporting snapshot %s: the stream ended before its last part", q.SnapshotId))
}

// ImportSnapshot implements Node.
func (r *Remote) ImportSnapshot(ctx context.Context, q *nodev1.ImportSnapshotRequest) (*nodev1.ImportSnapshotResponse, error) {
	return fromWire(r.c.ImportSnapshot(ctx, q))
}
