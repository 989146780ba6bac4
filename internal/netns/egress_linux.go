package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/egress"
)

// egressProxyPort is where, inside a router namespace, the egress proxy of
// a slot with domain rules listens; its HTTP and TLS connections are
// redirected there.
const egressProxyPort = 15001

// egressNATChain holds the redirect of a slot with domain rules.
const egressNATChain = "egressnat"

// slotProxy is a slot's egress proxy: a listener in its router namespace
// and the rules it applies.
type slotProxy struct {
	l     net.Listener
	rules atomic.Pointer[egress.Rules]
	done  chan struct{}
}

// stopProxy ends s's egress proxy, if it has one.
func (s *Slot) stopProxy() {
	s.proxyMu.Lock()
	p := s.proxy
	s.proxy = nil
	s.proxyMu.Unlock()
	if p != nil {
		p.l.Close()
		<-p.done
	}
}

// rulesOf is the egress package's view of opts.
func rulesOf(opts SlotOptions) egress.Rules {
	return egress.Rules{AllowInternet: opts.AllowInternet, AllowOut: opts.AllowOut, DenyOut: opts.DenyOut, AllowDomains: opts.AllowDomains}
}

// applyDomains starts, updates or stops s's egress proxy and the
// redirect to it, after setEgress applied the address rules.
func (m *Manager) applyDomains(s *Slot, opts SlotOptions) error {
	c, err := nftAt(s.RouterNSPath)
	if err != nil {
		return fmt.Errorf("setting domain rules of %s: %w", s.Name, err)
	}
	defer c.CloseLasting()
	t := hostTable(m.cfg.Tag)
	ch := &nftables.Chain{Name: egressNATChain, Table: t}
	c.FlushChain(ch)
	if len(opts.AllowDomains) == 0 {
		if err := c.Flush(); err != nil {
			return fmt.Errorf("setting domain rules of %s: %w", s.Name, err)
		}
		s.stopProxy()
		return nil
	}

	r := rulesOf(opts)
	s.proxyMu.Lock()
	if s.proxy == nil {
		if err := m.startProxy(s, r); err != nil {
			s.proxyMu.Unlock()
			return err
		}
	}
	s.proxy.rules.Store(&r)
	s.proxyMu.Unlock()
	for _, port := range []uint16{80, 443} {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: cat(
			ifName(expr.MetaKeyIIFNAME, routerSandbox),
			tcpDport(port),
			[]expr.Any{
				&expr.Immediate{Register: 1, Data: binaryPort(egressProxyPort)},
				&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
			},
		)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("setting domain rules of %s: %w", s.Name, err)
	}
	return nil
}

// startProxy opens s's listener inside its router namespace and serves it
// with rules. s.proxyMu held.
func (m *Manager) startProxy(s *Slot, rules egress.Rules) error {
	ns, err := openNS(s.RouterNSPath)
	if err != nil {
		return fmt.Errorf("starting the egress proxy of %s: %w", s.Name, err)
	}
	defer ns.Close()
	var l net.Listener
	if err := inNS(ns, func() (err error) {
		l, err = net.Listen("tcp4", "0.0.0.0:"+strconv.Itoa(egressProxyPort))
		return err
	}); err != nil {
		return fmt.Errorf("starting the egress proxy of %s: %w", s.Name, err)
	}
	p := &slotProxy{l: l, done: make(chan struct{})}
	p.rules.Store(&rules) // before the first connection can arrive
	s.proxy = p
	px := &egress.Proxy{
		// A name that a domain rule allows may still resolve to a blocked
		// range or to a cluster member: refused all the same. Read at each
		// connection, as the host's networks and the cluster change.
		Blocked: func(a netip.Addr) bool {
			m.mu.Lock()
			defer m.mu.Unlock()
			return m.cfg.refuses(a)
		},
		Resolver: m.resolver(),
		Logger:   m.log.With("slot", s.Name),
		OnRefused: func(r egress.Refusal) {
			if m.cfg.OnEgressRefused != nil {
				m.cfg.OnEgressRefused(s, r)
			}
		},
	}
	go func() {
		defer close(p.done)
		px.Serve(l, func() egress.Rules { return *p.rules.Load() }, egress.OriginalDst)
	}()
	return nil
}

// resolver resolves names with the resolvers sandboxes use, so that the
// proxy sees the answers the sandbox saw.
func (m *Manager) resolver() *net.Resolver {
	if len(m.cfg.DNSServers) == 0 {
		return net.DefaultResolver
	}
	server := net.JoinHostPort(m.cfg.DNSServers[0].String(), "53")
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, server)
	}}
}

// tcpDport matches TCP to port.
func tcpDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryPort(port)},
	}
}

func binaryPort(p uint16) []byte { return []byte{byte(p >> 8), byte(p)} }

// refuse is the verdict of a refused connection from a sandbox: a TCP
// reset, else an ICMP "administratively prohibited", so that it fails at
// once instead of timing out. Each is counted by count: an anonymous
// counter, or a reference to a named one (refusedCounter).
func refuse(count expr.Any) [][]expr.Any {
	return [][]expr.Any{
		cat([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
			count,
			&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
		}),
		{count, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}},
	}
}

// refusedCounter is the named counter of a router's refusals, which its
// rules share: RefusedCount reads it in one small request, where summing
// the rules' own counters meant fetching and decoding the whole forward
// chain, for every sandbox every few seconds (a quarter of an idle
// server's CPU with 100 sandboxes).
const refusedCounter = "refused"

// refusedCounterIn is refusedCounter in router table t, as it is added,
// read and reset.
func refusedCounterIn(t *nftables.Table) *nftables.CounterObj {
	return &nftables.CounterObj{Table: t, Name: refusedCounter}
}

// countRefused is the expression that adds a packet to refusedCounter.
func countRefused() expr.Any {
	return &expr.Objref{Type: int(nftables.ObjTypeCounter), Name: refusedCounter}
}

// RefusedCount is how many packets of new connections s's router has
// refused (by address; the proxy reports its refusals itself).
func (m *Manager) RefusedCount(s *Slot) (uint64, error) {
	c, err := nftAt(s.RouterNSPath)
	if err != nil {
		return 0, err
	}
	defer c.CloseLasting()
	t := hostTable(m.cfg.Tag)
	o, err := c.GetObject(refusedCounterIn(t))
	if ctr, ok := o.(*nftables.CounterObj); err == nil && ok {
		return ctr.Packets, nil
	}
	// A router set up before the named counter (its sandbox outlived a
	// restart into this version) counts in its rules.
	rules, err := c.GetRules(t, &nftables.Chain{Name: "forward", Table: t})
	if err != nil {
		return 0, fmt.Errorf("reading the refusals of %s: %w", s.Name, err)
	}
	var n uint64
	for _, r := range rules {
		for _, e := range r.Exprs {
			if ctr, ok := e.(*expr.Counter); ok {
				n += ctr.Packets
			}
		}
	}
	return n, nil
}
