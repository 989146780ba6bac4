package netns

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// clusterSet names the host table's set of the cluster members'
// addresses (Config.ClusterAddrs).
const clusterSet = "cluster"

// clusterSetOf is the host table's cluster set, as a handle for
// updates.
func clusterSetOf(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: clusterSet, KeyType: nftables.TypeIPAddr, ID: clusterSetID}
}

// clusterSetID names the cluster set within the batch that adds it and
// the rules that look it up. It is given, not left to nftables: the
// library numbers sets from a package counter without a lock, which two
// nodes in one process (tests; a server's local node beside another)
// race on. It is the only set of its batch, so any number will do.
const clusterSetID = 1

// clusterElements are the set's elements for addrs: their IPv4 ones.
func clusterElements(addrs []netip.Addr) []nftables.SetElement {
	var out []nftables.SetElement
	for _, a := range addrs {
		if a.Is4() {
			b := a.As4()
			out = append(out, nftables.SetElement{Key: b[:]})
		}
	}
	return out
}

// addClusterRules adds to the host table's forward chain the refusal of
// whatever a slot sends to a cluster member:
//
//	iifname "<tag>*" ip daddr @cluster counter reject
//
// in the host table, not the routers', so that a change is one update of
// the set for every slot at once; the routers have let it through by
// then only when the sandbox's own egress rules allow it, which these do
// not care about. It refuses (a reset, else ICMP "administratively
// prohibited") rather than drops, so that the sandbox's connect fails at
// once.
func addClusterRules(c *nftables.Conn, cfg Config, t *nftables.Table, fwd *nftables.Chain) error {
	set := clusterSetOf(t)
	if err := c.AddSet(set, clusterElements(cfg.ClusterAddrs)); err != nil {
		return fmt.Errorf("adding the cluster set: %w", err)
	}
	for _, r := range refuse(&expr.Counter{}) {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
			ifPrefix(expr.MetaKeyIIFNAME, cfg.Tag, expr.CmpOpEq),
			isIPv4(),
			[]expr.Any{
				&expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1,
					Base: expr.PayloadBaseNetworkHeader, Offset: ipDst, Len: 4},
				&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
			},
			r,
		)})
	}
	return nil
}

// SetClusterAddrs replaces the cluster members' addresses that no
// sandbox may reach (Config.ClusterAddrs), for every slot at once: one
// atomic update of the host table's set. Connections already open to an
// address newly added are cut at their next packet.
func (m *Manager) SetClusterAddrs(addrs []netip.Addr) error {
	addrs = uniqueAddrs(addrs)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("setting the cluster's addresses: %w", ErrClosed)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("setting the cluster's addresses: opening nftables: %w", err)
	}
	set := clusterSetOf(hostTable(m.cfg.Tag))
	c.FlushSet(set)
	if els := clusterElements(addrs); len(els) > 0 {
		if err := c.SetAddElements(set, els); err != nil {
			return fmt.Errorf("setting the cluster's addresses: %w", err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("setting the cluster's addresses in table %s: %w", m.cfg.Tag, err)
	}
	m.cfg.ClusterAddrs = addrs
	return nil
}
