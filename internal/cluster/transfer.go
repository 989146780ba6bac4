package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// Without a store the nodes share, a snapshot is only on the node that
// took it. A sandbox that starts from it elsewhere (a migration, a resume
// on another node, a fork's child where its parent's node is full) needs
// it there first: this server relays it, from the holder's
// ExportSnapshot stream to the other node's ImportSnapshot, with the
// template it runs on when that node lacks it. Nodes take calls from
// servers only (the node hop's mutual TLS accepts server certificates),
// so the server carries it rather than the nodes talking to each other.

// transferAttempts bounds the tries of one snapshot's move: each resumes
// where the one before was cut.
const transferAttempts = 5

// transferBackoff is the pause between two tries of a move.
const transferBackoff = 200 * time.Millisecond

// bringSnapshot makes sure node dest can restore snapshot snapID of
// sandbox id, which node holder took. When dest has it already (the store
// it shares, or its own copy) nothing moves; else it is relayed from
// holder. When neither can supply it, the error is ErrConflict, naming
// the sandbox and why.
func (c *Cluster) bringSnapshot(ctx context.Context, id, snapID, holder string, dest nodeapi.Node) error {
	if holder == "" || holder == dest.ID() {
		return nil
	}
	begin, err := dest.ImportSnapshot(ctx, &nodev1.ImportSnapshotRequest{SnapshotId: snapID, Step: nodev1.ImportSnapshotRequest_STEP_BEGIN})
	switch {
	case errors.Is(err, nodeapi.ErrUnimplemented):
		return nil // a node from before transfers: its restore tells
	case err != nil:
		return fmt.Errorf("moving snapshot %s of sandbox %s to node %s: %w", snapID, id, dest.ID(), classifyNodeError(err))
	case begin.Present:
		return nil
	}
	gone := func(why string) error {
		return fmt.Errorf("%w: sandbox %s cannot start on node %s: its snapshot %s is only on node %s, %s, and no store the nodes share holds it",
			ErrConflict, id, dest.ID(), snapID, holder, why)
	}
	src, err := c.nodes.node(holder)
	if err != nil {
		return gone("which cannot be reached (" + err.Error() + ")")
	}
	info, err := src.GetSnapshot(ctx, &nodev1.GetSnapshotRequest{IdOrName: snapID})
	switch {
	case errors.Is(err, nodeapi.ErrNotFound):
		return gone("which no longer has it")
	case errors.Is(err, nodeapi.ErrUnavailable):
		return gone("which does not answer (" + nodeapi.Message(err) + ")")
	case err != nil:
		return fmt.Errorf("moving snapshot %s of sandbox %s: looking it up on node %s: %w", snapID, id, holder, classifyNodeError(err))
	}
	start := time.Now()
	var sent int64
	for attempt := 1; ; attempt++ {
		n, err := relaySnapshot(ctx, src, dest, info)
		sent += n
		if err == nil {
			c.log.Info("snapshot moved between nodes", "sandbox_id", id, "snapshot_id", snapID, "from", holder, "to", dest.ID(),
				"bytes", sent, "attempts", attempt, "took_ms", time.Since(start).Milliseconds())
			return nil
		}
		if attempt == transferAttempts || ctx.Err() != nil || !retryableTransfer(err) {
			if errors.Is(err, nodeapi.ErrNotFound) {
				return gone("which no longer has it")
			}
			return fmt.Errorf("moving snapshot %s of sandbox %s from node %s to node %s (%d attempts): %w",
				snapID, id, holder, dest.ID(), attempt, classifyNodeError(err))
		}
		c.log.Warn("moving a snapshot between nodes was cut; resuming", "sandbox_id", id, "snapshot_id", snapID,
			"from", holder, "to", dest.ID(), "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(transferBackoff):
		}
	}
}

// retryableTransfer says whether a move that failed with err may go on
// where it stopped: a cut (a stream or a connection that dropped, a file
// that did not arrive whole), not a refusal.
func retryableTransfer(err error) bool {
	for _, refusal := range []error{nodeapi.ErrInvalid, nodeapi.ErrNotFound, nodeapi.ErrFailedPrecondition,
		nodeapi.ErrUnimplemented, nodeapi.ErrResourceExhausted, nodeapi.ErrExists} {
		if errors.Is(err, refusal) {
			return false
		}
	}
	return true
}

// relaySnapshot makes one try at moving snapshot info from node src to
// node dest, from what dest has of it, and reports the bytes it relayed.
func relaySnapshot(ctx context.Context, src, dest nodeapi.Node, info *nodev1.SnapshotInfo) (int64, error) {
	begin, err := dest.ImportSnapshot(ctx, &nodev1.ImportSnapshotRequest{SnapshotId: info.Id,
		Step: nodev1.ImportSnapshotRequest_STEP_BEGIN, TemplateId: info.TemplateId})
	if err != nil || begin.Present {
		return 0, err
	}
	var files []*nodev1.TransferFile
	var sent int64
	err = src.ExportSnapshot(ctx, &nodev1.ExportSnapshotRequest{SnapshotId: info.Id, Template: !begin.TemplatePresent, Offsets: begin.Received},
		func(p *nodev1.SnapshotPart) error {
			switch {
			case p.Done != nil:
				files = append(files, p.Done)
			case p.File != "":
				if _, err := dest.ImportSnapshot(ctx, &nodev1.ImportSnapshotRequest{SnapshotId: info.Id,
					Step: nodev1.ImportSnapshotRequest_STEP_CHUNK, File: p.File, Offset: p.Offset, Data: p.Data}); err != nil {
					return err
				}
				sent += int64(len(p.Data))
			}
			return nil
		})
	if err != nil {
		return sent, err
	}
	_, err = dest.ImportSnapshot(ctx, &nodev1.ImportSnapshotRequest{SnapshotId: info.Id, Step: nodev1.ImportSnapshotRequest_STEP_COMMIT, Files: files})
	return sent, err
}

// abortImport drops what node dest received of snapshot snapID, for a
// move that was given up (the snapshot goes too).
func (c *Cluster) abortImport(ctx context.Context, dest nodeapi.Node, snapID string) {
	if _, err := dest.ImportSnapshot(context.WithoutCancel(ctx), &nodev1.ImportSnapshotRequest{SnapshotId: snapID,
		Step: nodev1.ImportSnapshotRequest_STEP_ABORT}); err != nil && !errors.Is(err, nodeapi.ErrUnimplemented) {
		c.log.Warn("dropping a snapshot's partial move", "snapshot_id", snapID, "node_id", dest.ID(), "err", err)
	}
}
