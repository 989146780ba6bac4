// Package nodeapi is the seam between the control plane and the nodes that
// run sandboxes, and only the wire: one interface, Node, with its own wire
// types (nodev1, generated from proto/node) and its own error classes
// (errors.go: ErrNotFound, ..., carried as Connect codes on the wire); the client of a node agent across the network (Remote) and the
// handler that serves a Node (Handler). The node's side, answering Node
// with a node in this process, is package node/nodeserver. The cluster
// package sees only this interface and never links the node, so that
// nothing it relies on works in-process and not remotely.
package nodeapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// gen.sh builds the protoc plugins at the versions in go.mod, so a clean
// checkout needs only protoc.
//go:generate sh gen.sh

// Node is what the control plane asks of a node. Its errors match the
// classes of errors.go (ErrNotFound, ...) with errors.Is: callers
// classify with those, never with the transport's codes.
type Node interface {
	// ID names the node in the registry and in sandbox records.
	ID() string
	Info(context.Context, *nodev1.InfoRequest) (*nodev1.NodeInfo, error)
	Create(context.Context, *nodev1.CreateRequest) (*nodev1.Sandbox, error)
	Kill(context.Context, *nodev1.KillRequest) (*nodev1.KillResponse, error)
	List(context.Context, *nodev1.ListRequest) (*nodev1.ListResponse, error)
	Snapshot(context.Context, *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error)
	Stats(context.Context, *nodev1.StatsRequest) (*nodev1.SandboxStats, error)
	ListSnapshots(context.Context, *nodev1.ListSnapshotsRequest) (*nodev1.ListSnapshotsResponse, error)
	GetSnapshot(context.Context, *nodev1.GetSnapshotRequest) (*nodev1.SnapshotInfo, error)
	DeleteSnapshot(context.Context, *nodev1.DeleteSnapshotRequest) (*nodev1.DeleteSnapshotResponse, error)
	Logs(context.Context, *nodev1.LogsRequest) (*nodev1.LogsResponse, error)
	CreateVolume(context.Context, *nodev1.CreateVolumeRequest) (*nodev1.CreateVolumeResponse, error)
	UpdateNetwork(context.Context, *nodev1.UpdateNetworkRequest) (*nodev1.UpdateNetworkResponse, error)
	ExportVolume(context.Context, *nodev1.ExportVolumeRequest) (*nodev1.ExportVolumeResponse, error)
	ImportVolume(context.Context, *nodev1.ImportVolumeRequest) (*nodev1.ImportVolumeResponse, error)
	DeleteVolume(context.Context, *nodev1.DeleteVolumeRequest) (*nodev1.DeleteVolumeResponse, error)
	Metrics(context.Context, *nodev1.MetricsRequest) (*nodev1.MetricsResponse, error)
	// Events calls fn with each event the node reports, beginning with a
	// SYNC once the subscription is in place, until ctx ends (nil) or the
	// stream breaks (its error).
	Events(ctx context.Context, fn func(*nodev1.Event)) error
	// PutBuildContext takes one chunk of a build's context, before the
	// Build that names it.
	PutBuildContext(context.Context, *nodev1.PutBuildContextRequest) (*nodev1.PutBuildContextResponse, error)
	// Build runs a template build, calling fn with each event (log lines,
	// then the result last) until the build ends (nil once the result was
	// given) or the stream breaks (its error). Ending ctx cancels the
	// build on the node.
	Build(ctx context.Context, req *nodev1.BuildRequest, fn func(*nodev1.BuildEvent)) error
	// Pull makes a template of an OCI image (an upload's after its
	// PutBuildContext), calling fn with each event (progress and log
	// lines, then the result last) as Build does.
	Pull(ctx context.Context, req *nodev1.PullRequest, fn func(*nodev1.PullEvent)) error
	// ExportSnapshot streams a snapshot the node holds (and its
	// template's files, when asked), calling fn with each part until the
	// last (nil once it was given), the stream breaks (its error, a
	// stream cut short being ErrUnavailable) or fn fails (its error).
	ExportSnapshot(ctx context.Context, req *nodev1.ExportSnapshotRequest, fn func(*nodev1.SnapshotPart) error) error
	// ImportSnapshot takes one step of a snapshot's import (begin, a
	// chunk, commit, abort), for what ExportSnapshot streams from another
	// node.
	ImportSnapshot(context.Context, *nodev1.ImportSnapshotRequest) (*nodev1.ImportSnapshotResponse, error)
}

// Code is err's Connect code: CodeUnknown for an error that is not a
// node API error. For the transport's own edges (logs, HTTP mapping);
// the control plane classifies with errors.Is and the classes.
func Code(err error) connect.Code { return connect.CodeOf(err) }

// Message is the node's own description of err, without the code prefix
// Connect adds.
func Message(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// TokenHeader carries the cluster token on every request between servers
// and nodes. It is not Authorization, which sandbox traffic through a
// node's proxy uses for its own purposes.
const TokenHeader = "X-Aenv-Cluster-Token"

// RequireToken serves h only to requests that carry token, answering the
// others 401 and logging who they came from.
func RequireToken(token string, log *slog.Logger, h http.Handler) http.Handler {
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get(TokenHeader))
		if len(want) == 0 || subtle.ConstantTimeCompare(got, want) != 1 {
			log.Warn("refused a request with a wrong or missing cluster token",
				"remote", r.RemoteAddr, "path", r.URL.Path)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]any{
				"code": http.StatusUnauthorized, "message": "wrong or missing cluster token",
			})
			return
		}
		r.Header.Del(TokenHeader)
		h.ServeHTTP(w, r)
	})
}
