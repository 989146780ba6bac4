package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// The node registry's records and keys are membership's, which node
// agents write; the cluster reads them.
type (
	// NodeInfo is a node's record in the registry.
	NodeInfo = membership.NodeInfo
	// NodeUsage is an amount of a node's resources.
	NodeUsage = membership.NodeUsage
	// NodeState is what a node is doing, as operators see it.
	NodeState = membership.NodeState
)

// Node states.
const (
	NodeReady    = membership.NodeReady
	NodeDraining = membership.NodeDraining
	NodeLost     = membership.NodeLost
)

const (
	nodeRefresh     = membership.ReportInterval
	nodeLivePrefix  = membership.LivePrefix
	nodeKnownPrefix = membership.KnownPrefix
	nodeDrainPrefix = membership.DrainPrefix
)

// InfoFromWire is a node's description as the node API reports it.
func InfoFromWire(w *nodev1.NodeInfo) NodeInfo { return membership.InfoFromWire(w) }

// Nodes returns every node the cluster has known, with its state:
// draining if an operator drained it, lost if its lease expired, ready
// otherwise. A lost node shows what it last reported.
func (c *Cluster) Nodes(ctx context.Context) ([]NodeInfo, error) {
	entries, _, err := c.cfg.State.List(ctx, membership.RegistryPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	reg := parseRegistry(entries)
	counts := map[string]int{}
	c.recs.each(func(r *record) {
		if r.State == StateRunning {
			counts[r.NodeID]++
		}
	})
	// One consistent list, and a node's known key is written before its
	// live one and never removed: every live node is known.
	var out []NodeInfo
	for id, n := range reg.known {
		if l, ok := reg.live[id]; ok {
			n, n.State = l, NodeReady
		} else {
			n.State = NodeLost
		}
		if reg.drained[id] && n.State == NodeReady {
			n.State = NodeDraining
		}
		n.ID, n.Sandboxes = id, counts[id]
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// registry is the node registry as read from the store.
type registry struct {
	live, known map[string]NodeInfo
	drained     map[string]bool
}

// parseRegistry decodes the entries under membership.RegistryPrefix.
func parseRegistry(entries []state.Entry) registry {
	reg := registry{live: map[string]NodeInfo{}, known: map[string]NodeInfo{}, drained: map[string]bool{}}
	for _, e := range entries {
		for prefix, into := range map[string]map[string]NodeInfo{nodeLivePrefix: reg.live, nodeKnownPrefix: reg.known} {
			if id, ok := strings.CutPrefix(e.Key, prefix); ok {
				var n NodeInfo
				if json.Unmarshal(e.Value, &n) == nil {
					into[id] = n
				}
			}
		}
		if id, ok := strings.CutPrefix(e.Key, nodeDrainPrefix); ok {
			reg.drained[id] = true
		}
	}
	return reg
}

// GetNode returns one node (ErrNotFound for an id never seen).
func (c *Cluster) GetNode(ctx context.Context, id string) (*NodeInfo, error) {
	all, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if all[i].ID == id {
			return &all[i], nil
		}
	}
	return nil, fmt.Errorf("%w: node %s", ErrNotFound, id)
}

// SetDraining marks a node draining (it takes no new sandboxes; its
// running ones keep running) or ready again.
func (c *Cluster) SetDraining(ctx context.Context, id string, draining bool) (*NodeInfo, error) {
	if _, err := c.GetNode(ctx, id); err != nil {
		return nil, err
	}
	var err error
	wrote := true
	if draining {
		_, err = c.cfg.State.Put(ctx, nodeDrainPrefix+id, []byte(time.Now().UTC().Format(time.RFC3339)), state.WriteOptions{})
		c.log.Info("node draining: it takes no new sandboxes", "node_id", id)
	} else if err = c.cfg.State.Delete(ctx, nodeDrainPrefix+id, 0); errors.Is(err, state.ErrNotFound) {
		err, wrote = nil, false // no event will follow
	}
	if err != nil {
		return nil, fmt.Errorf("draining node %s: %w", id, err)
	}
	// Placement here sees it at once.
	if wrote {
		c.nodes.wroteDrain(id, draining)
	} else {
		c.nodes.setDrained(id, draining)
	}
	return c.GetNode(ctx, id)
}
