package nodeserver

import (
	"context"
	"errors"
	"fmt"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/transfer"
)

// ExportSnapshot implements nodeapi.Node.
func (l *Local) ExportSnapshot(ctx context.Context, req *nodev1.ExportSnapshotRequest, fn func(*nodev1.SnapshotPart) error) error {
	if !snapshot.ValidID(req.SnapshotId) {
		return nodeapi.NewError(connect.CodeInvalidArgument, fmt.Errorf("exporting snapshot %q: invalid id", req.SnapshotId))
	}
	// sendErr tells the receiver's failure (the caller's) from the node's.
	var sendErr error
	err := l.n.ExportSnapshot(ctx, req.SnapshotId, node.ExportOptions{Template: req.Template, Offsets: req.Offsets}, func(p transfer.Part) error {
		part := &nodev1.SnapshotPart{File: p.File, Offset: p.Offset, Data: p.Data}
		if p.Done != nil {
			part = &nodev1.SnapshotPart{Done: fileToWire(*p.Done)}
		}
		sendErr = fn(part)
		return sendErr
	})
	if err != nil {
		if sendErr != nil {
			return sendErr
		}
		return wireError(err)
	}
	return fn(&nodev1.SnapshotPart{Last: true})
}

// ImportSnapshot implements nodeapi.Node.
func (l *Local) ImportSnapshot(ctx context.Context, req *nodev1.ImportSnapshotRequest) (*nodev1.ImportSnapshotResponse, error) {
	id := req.SnapshotId
	if !snapshot.ValidID(id) {
		return nil, nodeapi.NewError(connect.CodeInvalidArgument, fmt.Errorf("importing snapshot %q: invalid id", id))
	}
	switch req.Step {
	case nodev1.ImportSnapshotRequest_STEP_BEGIN:
		st, err := l.n.BeginImport(ctx, id, req.TemplateId)
		if err != nil {
			return nil, wireError(err)
		}
		return &nodev1.ImportSnapshotResponse{Present: st.Present, TemplatePresent: st.TemplatePresent, Received: st.Received}, nil
	case nodev1.ImportSnapshotRequest_STEP_CHUNK:
		if err := l.n.ImportChunk(id, req.File, req.Offset, req.Data); err != nil {
			return nil, wireError(err)
		}
	case nodev1.ImportSnapshotRequest_STEP_COMMIT:
		files := make([]transfer.File, len(req.Files))
		for i, f := range req.Files {
			files[i] = transfer.File{Name: f.Name, Size: f.Size, SHA256: f.Sha256}
		}
		if _, err := l.n.CommitImport(ctx, id, files); err != nil {
			if errors.Is(err, transfer.ErrMismatch) {
				// Sent again, it may well arrive whole.
				return nil, nodeapi.NewError(connect.CodeUnavailable, err)
			}
			return nil, wireError(err)
		}
	case nodev1.ImportSnapshotRequest_STEP_ABORT:
		l.n.AbortImport(id)
	default:
		return nil, nodeapi.NewError(connect.CodeInvalidArgument, fmt.Errorf("importing snapshot %s: unknown step %v", id, req.Step))
	}
	return &nodev1.ImportSnapshotResponse{}, nil
}

func fileToWire(f transfer.File) *nodev1.TransferFile {
	return &nodev1.TransferFile{Name: f.Name, Size: f.Size, Sha256: f.SHA256}
}
