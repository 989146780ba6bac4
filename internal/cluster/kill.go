package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// Kill ends a sandbox and forgets it. The record goes first: once Kill
// has begun no other server can pause or resume the sandbox.
func (c *Cluster) Kill(ctx context.Context, id string) error {
	sb, err := c.Get(ctx, id)
	if err != nil {
		return err
	}
	if err := c.recs.remove(ctx, id, ""); err != nil {
		return err
	}
	if sb.State == StatePaused {
		c.deleteSnapshotQuietly(sb.SnapshotID, "paused sandbox's snapshot", sb.NodeID)
		return nil
	}
	defer c.gone(id, "")
	n, err := c.nodes.node(sb.NodeID)
	if err != nil {
		c.log.Warn("killed sandbox's node is unreachable; its record is gone", "sandbox_id", id, "err", err)
		return nil
	}
	_, err = n.Kill(ctx, &nodev1.KillRequest{SandboxId: id})
	if errors.Is(err, nodeapi.ErrNotFound) {
		return nil // it died meanwhile; the record is gone either way
	}
	if err != nil {
		return fmt.Errorf("killing sandbox %s on node %s: %w", id, sb.NodeID, err)
	}
	c.nodes.left(sb.NodeID, sb.MemoryMB)
	return nil
}
