package node

import (
	"context"
	"fmt"
	"path"

	"github.com/aenvhq/aenv/internal/egress"
	"github.com/aenvhq/aenv/internal/netns"

	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// volumeBinds binds the volumes of mounts read-write at their paths.
func (n *Node) volumeBinds(mounts []snapshot.Mount) ([]runtime.Bind, error) {
	var binds []runtime.Bind
	for _, m := range mounts {
		if n.cfg.Volumes == nil || !n.cfg.Volumes.Exists(m.VolumeID) {
			return nil, fmt.Errorf("mounting volume %s: %w: it is not on node %s", m.VolumeID, ErrNotFound, n.cfg.ID)
		}
		if !path.IsAbs(m.Path) || path.Clean(m.Path) == "/" {
			return nil, fmt.Errorf("mounting volume %s at %q: %w: the path must be absolute and not /", m.VolumeID, m.Path, ErrInvalid)
		}
		src, err := n.cfg.Volumes.Path(m.VolumeID)
		if err != nil {
			return nil, err
		}
		binds = append(binds, runtime.Bind{Source: src, Destination: path.Clean(m.Path), Writable: true})
	}
	return binds, nil
}

// CreateVolume makes volume id's directory on this node.
func (n *Node) CreateVolume(id string) error {
	if n.cfg.Volumes == nil {
		return fmt.Errorf("creating volume %s: %w: this node keeps no volumes", id, ErrUnsupported)
	}
	_, err := n.cfg.Volumes.Create(id)
	return err
}

// DeleteVolume removes volume id and its files from this node.
func (n *Node) DeleteVolume(id string) error {
	if n.cfg.Volumes == nil || !n.cfg.Volumes.Exists(id) {
		return fmt.Errorf("deleting volume %s: %w", id, ErrNotFound)
	}
	return n.cfg.Volumes.Delete(id)
}

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
