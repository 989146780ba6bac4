package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// NetworkRules are a sandbox's E2B network settings that aenv enforces
// past the create: egress rules and the Host mask of inbound requests.
type NetworkRules struct {
	// AllowOut entries are CIDRs, addresses or domain names ("*.x" for
	// x's subdomains); they win over DenyOut (CIDRs, addresses).
	AllowOut, DenyOut []string
	// MaskRequestHost replaces the Host of requests to the sandbox's own
	// ports; ${PORT} in it becomes the port.
	MaskRequestHost string
	// AllowInternet, when set in an update, changes the sandbox's
	// allow_internet_access (a create takes CreateRequest's).
	AllowInternet *bool
}

// maxNetworkRules bounds each list.
const maxNetworkRules = 100

// validate checks the rules as the node will read them.
func (n NetworkRules) validate() error {
	if len(n.AllowOut) > maxNetworkRules || len(n.DenyOut) > maxNetworkRules {
		return fmt.Errorf("%w: at most %d allowOut and %d denyOut entries", ErrInvalid, maxNetworkRules, maxNetworkRules)
	}
	if _, err := nodeapi.ParseEgressRules(n.AllowOut, n.DenyOut); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(n.MaskRequestHost) > 255 || strings.ContainsAny(n.MaskRequestHost, " \r\n\t/") {
		return fmt.Errorf("%w: maskRequestHost must be a host[:port] (${PORT} allowed)", ErrInvalid)
	}
	return nil
}

// UpdateNetwork replaces sandbox id's network rules (E2B's PUT
// /sandboxes/{id}/network: what is left out is cleared). A running
// sandbox gets the new egress rules at once (open connections stay); a
// paused one when it resumes.
func (c *Cluster) UpdateNetwork(ctx context.Context, id string, rules NetworkRules) (*Sandbox, error) {
	if err := rules.validate(); err != nil {
		return nil, err
	}
	cur, err := c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	// Claimed like a pause or a migration, so that neither runs with the
	// rules it read before this update.
	claimed, err := c.claim(ctx, id, cur.State, "network")
	if err != nil {
		return nil, err
	}
	sb := &claimed.Sandbox
	internet := sb.AllowInternet
	if rules.AllowInternet != nil {
		internet = *rules.AllowInternet
	}
	if sb.State == StateRunning {
		n, err := c.nodes.node(sb.NodeID)
		if err != nil {
			c.release(ctx, id, "network")
			return nil, err
		}
		if _, err := n.UpdateNetwork(ctx, &nodev1.UpdateNetworkRequest{SandboxId: id, AllowInternet: internet,
			AllowOut: rules.AllowOut, DenyOut: rules.DenyOut}); err != nil {
			c.release(ctx, id, "network")
			if errors.Is(err, nodeapi.ErrNotFound) { // it just ended
				return nil, c.notFound(ctx, id)
			}
			return nil, fmt.Errorf("updating the network of sandbox %s: %w", id, err)
		}
	}
	r, err := c.recs.mutate(ctx, id, func(r *record) error {
		r.Network = NetworkRules{AllowOut: rules.AllowOut, DenyOut: rules.DenyOut, MaskRequestHost: rules.MaskRequestHost}
		r.AllowInternet = internet
		if r.Op == "network" {
			r.clearOp()
		}
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		return nil, c.notFound(ctx, id)
	}
	if err != nil {
		return nil, err
	}
	c.log.Info("network rules updated", "sandbox_id", id, "allow_out", len(rules.AllowOut), "deny_out", len(rules.DenyOut))
	out := r.Sandbox
	return &out, nil
}
