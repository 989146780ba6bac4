package node

import (
	"context"
	"fmt"

	"github.com/aenvhq/aenv/internal/egress"
	"github.com/aenvhq/aenv/internal/netns"
)

// UpdateNetwork replaces a running sandbox's egress rules; connections it
// has open stay.
func (n *Node) UpdateNetwork(ctx context.Context, id string, opts netns.SlotOptions) error {
	sb, err := n.Get(id)
	if err != nil {
		return err
	}
	if err := n.cfg.Network.UpdateEgress(ctx, sb.slot, opts); err != nil {
		return fmt.Errorf("updating the network of sandbox %s: %w", id, err)
	}
	n.mu.Lock()
	sb.egress = opts
	n.mu.Unlock()
	n.logEvent(id, "info", "network rules updated", "allow_out", fmt.Sprint(len(opts.AllowOut)+len(opts.AllowDomains)),
		"deny_out", fmt.Sprint(len(opts.DenyOut)))
	return nil
}

// EgressRefused records a connection the sandbox on slot s was refused.
func (n *Node) EgressRefused(s *netns.Slot, r egress.Refusal) {
	n.mu.Lock()
	var id string
	for _, sb := range n.sandboxes {
		if sb.slot == s {
			id = sb.ID
		}
	}
	n.mu.Unlock()
	if id == "" {
		return
	}
	n.logEvent(id, "warn", "egress refused", "dst", r.Dst.String(), "domain", r.Domain, "reason", r.Reason)
}
