package netns

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The nftables rules, host side and router side. Both use inet tables so
// that the filter chains' drop policies also cover IPv6; every IPv4 match is
// guarded by `meta nfproto ipv4`.

const egressChain = "egress"

// nftConn is the type of Slot.nft.
type nftConn = *nftables.Conn

// dropNFT closes the slot's kept nftables connection, if any.
func (s *Slot) dropNFT() {
	if s.nft != nil {
		s.nft.CloseLasting()
		s.nft = nil
	}
}

// ipsDstNAT is the conntrack status bit IPS_DST_NAT (linux/netfilter/
// nf_conntrack_common.h): the connection's destination was rewritten.
const ipsDstNAT = 1 << 5

// hostTable is the host's nftables table of the sandboxes tagged tag
// (installHostTable writes it); its chains and sets are named within it.
func hostTable(tag string) *nftables.Table {
	return &nftables.Table{Name: tag, Family: nftables.TableFamilyINet}
}

// installHostTable replaces (atomically, in one batch) the host-side table:
//
//	table inet <tag> {
//	  chain postrouting { type nat hook postrouting priority srcnat
//	    ip saddr <prefix> oifname != "<tag>*" masquerade }
//	  chain forward { type filter hook forward priority filter; policy accept
//	    iifname "<tag>*" oifname "<tag>*" drop          # slot to slot
//	    oifname "<tag>*" ct state established,related accept
//	    oifname "<tag>*" drop                           # only the host opens connections into slots
//	    iifname "<tag>*" ip daddr <dns> udp/tcp dport 53 accept
//	    iifname "<tag>*" ip daddr @cluster counter reject  # see addClusterRules
//	    iifname "<tag>*" ip daddr <blocked> drop }      # defence in depth; routers drop these first
//	                                                    # (blocked: see blockedPrefixes, plus <prefix>)
//	  set cluster { type ipv4_addr; elements = { <ClusterAddrs> } }
//	  chain input { type filter hook input priority filter; policy accept
//	    iifname "<tag>*" ct state established,related accept
//	    iifname "<tag>*" drop }                         # slots never reach the host
//	}
func installHostTable(cfg Config) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := hostTable(cfg.Tag)
	// add+delete+add: replace whatever an earlier run left, in one
	// transaction, so the host is never without the rules.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(
		ipv4Addr(ipSrc, cfg.Prefix, expr.CmpOpEq),
		ifPrefix(expr.MetaKeyOIFNAME, cfg.Tag, expr.CmpOpNeq),
		[]expr.Any{&expr.Masq{}},
	)})

	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		ifPrefix(expr.MetaKeyIIFNAME, cfg.Tag, expr.CmpOpEq),
		ifPrefix(expr.MetaKeyOIFNAME, cfg.Tag, expr.CmpOpEq),
		verdict(expr.VerdictDrop),
	)})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		ifPrefix(expr.MetaKeyOIFNAME, cfg.Tag, expr.CmpOpEq),
		ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
		verdict(expr.VerdictAccept),
	)})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		ifPrefix(expr.MetaKeyOIFNAME, cfg.Tag, expr.CmpOpEq),
		verdict(expr.VerdictDrop),
	)})
	for _, dns := range dnsMatches(cfg.DNSServers) {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
			ifPrefix(expr.MetaKeyIIFNAME, cfg.Tag, expr.CmpOpEq),
			dns,
			verdict(expr.VerdictAccept),
		)})
	}
	// After the resolvers' port 53, as for the blocked ranges: a
	// resolver the host hands its sandboxes stays their resolver.
	if err := addClusterRules(c, cfg, t, fwd); err != nil {
		return fmt.Errorf("installing host nftables table %s: %w", cfg.Tag, err)
	}
	for _, p := range cfg.blocked() {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
			ifPrefix(expr.MetaKeyIIFNAME, cfg.Tag, expr.CmpOpEq),
			ipv4Addr(ipDst, p, expr.CmpOpEq),
			verdict(expr.VerdictDrop),
		)})
	}

	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
		ifPrefix(expr.MetaKeyIIFNAME, cfg.Tag, expr.CmpOpEq),
		ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
		verdict(expr.VerdictAccept),
	)})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
		ifPrefix(expr.MetaKeyIIFNAME, cfg.Tag, expr.CmpOpEq),
		verdict(expr.VerdictDrop),
	)})

	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing host nftables table %s: %w", cfg.Tag, err)
	}
	return nil
}

// removeHostTable deletes the host-side table; a missing table is fine.
func removeHostTable(tag string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("opening nftables: %w", err)
	}
	t := hostTable(tag)
	c.AddTable(t) // so that deleting a missing table is not an error
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing host nftables table %s: %w", tag, err)
	}
	return nil
}

// installRouterTable writes the router namespace's rules (egress chain
// empty, i.e. no outbound connections):
//
//	table inet <tag> {
//	  counter refused { }                                 # RefusedCount
//	  chain prerouting { type nat hook prerouting priority dstnat
//	    iifname "uplink" ip daddr <HostAddr> dnat ip to 169.254.0.21
//	    iifname "sandbox" jump egressnat }
//	  chain egressnat { }                                 # see applyDomains
//	  chain postrouting { type nat hook postrouting priority srcnat
//	    oifname "uplink" ip saddr 169.254.0.21 snat ip to <HostAddr> }
//	  chain forward { type filter hook forward priority filter; policy drop
//	    ct state established,related accept
//	    iifname "uplink" oifname "sandbox" ct status dnat accept
//	    iifname "sandbox" ip saddr != 169.254.0.21 drop   # no spoofing
//	    iifname "sandbox" ip daddr <blocked> counter name "refused" reject
//	    iifname "sandbox" oifname "uplink" jump egress
//	    iifname "sandbox" counter name "refused" reject } # what egress did not accept
//	  chain egress { }                                    # see setEgress
//	  chain input { type filter hook input priority filter; policy drop
//	    ct state established,related accept
//	    iifname "lo" accept
//	    iifname "sandbox" tcp dport <egress proxy> accept }
//	}
//
// Rejects are a TCP reset, or ICMP "administratively prohibited" for the
// rest, so that a refused connection fails at once.
func installRouterTable(c *nftables.Conn, cfg Config, s *Slot) error {
	t := c.AddTable(hostTable(cfg.Tag))
	c.AddObj(refusedCounterIn(t))

	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(
		ifName(expr.MetaKeyIIFNAME, routerUplink),
		ipv4Addr(ipDst, netip.PrefixFrom(s.HostAddr, 32), expr.CmpOpEq),
		natTo(expr.NATTypeDestNAT, sandboxAddr),
	)})

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(
		ifName(expr.MetaKeyOIFNAME, routerUplink),
		ipv4Addr(ipSrc, netip.PrefixFrom(sandboxAddr, 32), expr.CmpOpEq),
		natTo(expr.NATTypeSourceNAT, s.HostAddr),
	)})

	egress := c.AddChain(&nftables.Chain{Name: egressChain, Table: t})
	// A slot with domain rules redirects HTTP and TLS to its egress proxy
	// (see applyDomains); empty otherwise.
	enat := c.AddChain(&nftables.Chain{Name: egressNATChain, Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(
		ifName(expr.MetaKeyIIFNAME, routerSandbox),
		[]expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: enat.Name}},
	)})

	drop := nftables.ChainPolicyDrop
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
		verdict(expr.VerdictAccept),
	)})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		ifName(expr.MetaKeyIIFNAME, routerUplink),
		ifName(expr.MetaKeyOIFNAME, routerSandbox),
		ctStatus(ipsDstNAT),
		verdict(expr.VerdictAccept),
	)})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		ifName(expr.MetaKeyIIFNAME, routerSandbox),
		ipv4Addr(ipSrc, netip.PrefixFrom(sandboxAddr, 32), expr.CmpOpNeq),
		verdict(expr.VerdictDrop),
	)})
	// DNS to the configured resolvers goes through the egress chain even
	// when they sit in a blocked range: with egress on it is accepted there;
	// with egress off the chain returns and the drops below apply.
	for _, dns := range dnsMatches(cfg.DNSServers) {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
			ifName(expr.MetaKeyIIFNAME, routerSandbox),
			ifName(expr.MetaKeyOIFNAME, routerUplink),
			dns,
			[]expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: egress.Name}},
		)})
	}
	for _, p := range cfg.blocked() {
		for _, r := range refuse(countRefused()) {
			c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
				ifName(expr.MetaKeyIIFNAME, routerSandbox),
				ipv4Addr(ipDst, p, expr.CmpOpEq),
				r,
			)})
		}
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
		ifName(expr.MetaKeyIIFNAME, routerSandbox),
		ifName(expr.MetaKeyOIFNAME, routerUplink),
		[]expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: egress.Name}},
	)})
	// What the egress chain did not accept is refused at once (the
	// policy's silent drop would leave the sandbox's connect to time out).
	for _, r := range refuse(countRefused()) {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(
			ifName(expr.MetaKeyIIFNAME, routerSandbox),
			r,
		)})
	}

	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
		ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
		verdict(expr.VerdictAccept),
	)})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
		ifName(expr.MetaKeyIIFNAME, "lo"),
		verdict(expr.VerdictAccept),
	)})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(
		ifName(expr.MetaKeyIIFNAME, routerSandbox),
		tcpDport(egressProxyPort),
		verdict(expr.VerdictAccept),
	)})

	if err := c.Flush(); err != nil {
		return fmt.Errorf("installing router nftables table in %s: %w", s.RouterNSPath, err)
	}
	return nil
}

// setEgress replaces the router's egress chain with opts:
//
//	chain egress {
//	  ip daddr <dns> udp/tcp dport 53 accept  # only with AllowDomains
//	  ip daddr <AllowOut...> accept
//	  ip daddr <DenyOut...> return    # refused by the forward chain
//	  meta nfproto ipv4 accept        # only with AllowInternet
//	}
//
// A sandbox with domain rules may always ask the resolvers (dns): its
// names must resolve even when DenyOut covers everything. Connections
// already established keep flowing.
func setEgress(tag string, s *Slot, opts SlotOptions, dns []netip.Addr) error {
	for _, p := range append(slices.Clone(opts.AllowOut), opts.DenyOut...) {
		if !p.Addr().Is4() {
			return fmt.Errorf("setting egress of %s: prefix %s is not IPv4", s.Name, p)
		}
	}
	c := s.nft
	if c == nil {
		var err error
		if c, err = nftAt(s.RouterNSPath); err != nil {
			return fmt.Errorf("setting egress of %s: %w", s.Name, err)
		}
		defer c.CloseLasting()
	}
	t := hostTable(tag)
	ch := &nftables.Chain{Name: egressChain, Table: t}
	c.FlushChain(ch)
	if len(opts.AllowDomains) > 0 {
		for _, m := range dnsMatches(dns) {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(m, verdict(expr.VerdictAccept))})
		}
	}
	for _, p := range opts.AllowOut {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(
			ipv4Addr(ipDst, p.Masked(), expr.CmpOpEq), verdict(expr.VerdictAccept))})
	}
	for _, p := range opts.DenyOut {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(
			ipv4Addr(ipDst, p.Masked(), expr.CmpOpEq), verdict(expr.VerdictReturn))})
	}
	if opts.AllowInternet {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(
			isIPv4(), verdict(expr.VerdictAccept))})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("setting egress of %s: %w", s.Name, err)
	}
	return nil
}

// dnsMatches returns, for each resolver, the matches of DNS traffic to it:
// one for UDP and one for TCP, destination port 53.
func dnsMatches(servers []netip.Addr) [][]expr.Any {
	var out [][]expr.Any
	for _, a := range servers {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			out = append(out, cat(
				isIPv4(),
				ipv4Addr(ipDst, netip.PrefixFrom(a, 32), expr.CmpOpEq),
				[]expr.Any{
					&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
					&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 53}},
				},
			))
		}
	}
	return out
}

// Expression builders. Each returns the expressions of one match, to be
// concatenated into a rule with cat.

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// ifName matches an interface name exactly (NUL-padded to IFNAMSIZ).
func ifName(key expr.MetaKey, name string) []expr.Any {
	data := make([]byte, unix.IFNAMSIZ)
	copy(data, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
	}
}

// ifPrefix matches interface names starting with prefix, like nft's
// "prefix*": only len(prefix) bytes are compared.
func ifPrefix(key expr.MetaKey, prefix string, op expr.CmpOp) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte(prefix)},
	}
}

func isIPv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// Offsets of the addresses in the IPv4 header.
const (
	ipSrc = 12
	ipDst = 16
)

// ipv4Addr matches (op eq) or excludes (op neq) an IPv4 packet whose source
// or destination (offset ipSrc or ipDst) lies in p. With neq, non-IPv4
// packets do not match either.
func ipv4Addr(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	out := append(isIPv4(), &expr.Payload{
		OperationType: expr.PayloadLoad, DestRegister: 1,
		Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4,
	})
	if p.Bits() < 32 {
		mask := binary.BigEndian.AppendUint32(nil, ^uint32(0)<<(32-p.Bits()))
		if p.Bits() == 0 {
			mask = []byte{0, 0, 0, 0}
		}
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: mask, Xor: []byte{0, 0, 0, 0}})
	}
	a := p.Masked().Addr().As4()
	return append(out, &expr.Cmp{Op: op, Register: 1, Data: a[:]})
}

// ctState matches connections in any of the given states.
func ctState(bits uint32) []expr.Any { return ctBits(expr.CtKeySTATE, bits) }

// ctStatus matches connections with any of the given IPS_* status bits.
func ctStatus(bits uint32) []expr.Any { return ctBits(expr.CtKeySTATUS, bits) }

func ctBits(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: key},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, bits), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
}

// natTo rewrites the destination (DNAT) or source (SNAT) to addr.
func natTo(t expr.NATType, addr netip.Addr) []expr.Any {
	a := addr.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.NAT{Type: t, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}
