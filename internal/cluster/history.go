package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// Logs and metrics history live on the node that ran the sandbox (bounded
// there, never in the store): these ask the sandbox's node, or, for a
// sandbox no longer recorded (killed, lost), every node that still holds
// its history.

// Logs returns sandbox id's log, oldest first.
func (c *Cluster) Logs(ctx context.Context, id string) ([]*nodev1.LogEntry, error) {
	var out []*nodev1.LogEntry
	err := c.askHistory(ctx, id, func(n nodeapi.Node) error {
		r, err := n.Logs(ctx, &nodev1.LogsRequest{SandboxId: id})
		if err == nil {
			out = append(out, r.Entries...)
		}
		return err
	})
	return out, err
}

// Metrics returns sandbox id's resource samples, oldest first.
func (c *Cluster) Metrics(ctx context.Context, id string) ([]*nodev1.MetricSample, error) {
	var out []*nodev1.MetricSample
	err := c.askHistory(ctx, id, func(n nodeapi.Node) error {
		r, err := n.Metrics(ctx, &nodev1.MetricsRequest{SandboxId: id})
		if err == nil {
			out = append(out, r.Samples...)
		}
		return err
	})
	return out, err
}

// askHistory calls ask on the nodes that may hold id's history: its
// record's node, else every reachable node (a sandbox that moved or ended
// has history on each node it ran on; each part is kept).
func (c *Cluster) askHistory(ctx context.Context, id string, ask func(nodeapi.Node) error) error {
	var nodes []nodeapi.Node
	if sb, err := c.Get(ctx, id); err == nil && sb.State == StateRunning {
		n, err := c.nodes.node(sb.NodeID)
		if err != nil {
			return err
		}
		nodes = []nodeapi.Node{n}
	} else {
		nodes = c.nodes.reachable()
	}
	found := false
	var errs []error
	for _, n := range nodes {
		err := ask(n)
		switch {
		case err == nil:
			found = true
		case !errors.Is(err, nodeapi.ErrNotFound):
			errs = append(errs, fmt.Errorf("node %s: %w", n.ID(), err))
		}
	}
	if found {
		return nil
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: reading the history of sandbox %s: %w", ErrUnavailable, id, errors.Join(errs...))
	}
	return c.notFound(ctx, id)
}
