package nodeapi

import (
	"fmt"
	"net/netip"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/aenvhq/aenv/internal/egress"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// The bounds of a volume's size (CreateVolumeRequest.size_bytes), which
// the API checks before a create reaches a node: ext4 wants a few MiB for
// its journal and tables, and 16 TiB is what it addresses with 4 KiB
// blocks. Package volume, which makes the images, has the same bounds
// (its test keeps them equal).
const (
	MinVolumeSize = 8 << 20
	MaxVolumeSize = 16 << 40
)

// EgressRules are a sandbox's allowOut and denyOut entries as read off
// the wire: the cluster checks them before a create reaches a node, and
// the node applies them to the sandbox's network.
type EgressRules struct {
	AllowOut, DenyOut []netip.Prefix
	// AllowDomains are the allowOut entries that name hosts (with *.
	// wildcards), as egress.ParseDomain reads them.
	AllowDomains []string
}

// ParseEgressRules reads E2B's egress rules: allowOut entries are CIDRs,
// addresses or domain names (with *. wildcards), denyOut entries CIDRs or
// addresses.
func ParseEgressRules(allowOut, denyOut []string) (EgressRules, error) {
	var r EgressRules
	prefix := func(s string) (netip.Prefix, bool) {
		if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
			return p.Masked(), true
		}
		if a, err := netip.ParseAddr(s); err == nil && a.Is4() {
			return netip.PrefixFrom(a, 32), true
		}
		return netip.Prefix{}, false
	}
	for _, s := range allowOut {
		if p, ok := prefix(s); ok {
			r.AllowOut = append(r.AllowOut, p)
			continue
		}
		d, err := egress.ParseDomain(s)
		if err != nil {
			return r, fmt.Errorf("allowOut entry %q is not an IPv4 address, CIDR or domain name", truncateRule(s))
		}
		r.AllowDomains = append(r.AllowDomains, d)
	}
	for _, s := range denyOut {
		p, ok := prefix(s)
		if !ok {
			return r, fmt.Errorf("denyOut entry %q is not an IPv4 address or CIDR", truncateRule(s))
		}
		r.DenyOut = append(r.DenyOut, p)
	}
	return r, nil
}

func truncateRule(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// SnapshotToWire is s on the wire.
func SnapshotToWire(s *snapshot.Snapshot) *nodev1.SnapshotInfo {
	return &nodev1.SnapshotInfo{
		Id:              s.ID,
		Names:           s.Names,
		Kind:            string(s.Kind),
		SandboxId:       s.SandboxID,
		TemplateId:      s.TemplateID,
		CpuCount:        int32(s.CPUCount),
		MemoryMb:        int32(s.MemoryMB),
		DiskMb:          int32(s.DiskMB),
		EnvdVersion:     s.EnvdVersion,
		EnvdAccessToken: s.EnvdAccessToken,
		CreatedAt:       timestamppb.New(s.CreatedAt),
		SizeBytes:       s.SizeBytes,
		Runtime:         s.Runtime,
		RuntimeVersion:  s.RuntimeVersion,
	}
}

// SnapshotFromWire is the snapshot description w carries (without a
// local directory: the image is the node's).
func SnapshotFromWire(w *nodev1.SnapshotInfo) *snapshot.Snapshot {
	return &snapshot.Snapshot{
		ID:              w.Id,
		Names:           w.Names,
		Kind:            snapshot.Kind(w.Kind),
		SandboxID:       w.SandboxId,
		TemplateID:      w.TemplateId,
		CPUCount:        int(w.CpuCount),
		MemoryMB:        int(w.MemoryMb),
		DiskMB:          int(w.DiskMb),
		EnvdVersion:     w.EnvdVersion,
		EnvdAccessToken: w.EnvdAccessToken,
		CreatedAt:       w.CreatedAt.AsTime(),
		SizeBytes:       w.SizeBytes,
		Runtime:         w.Runtime,
		RuntimeVersion:  w.RuntimeVersion,
	}
}
