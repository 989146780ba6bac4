package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DetectHostNetworks returns the IPv4 networks the host is on: the
// prefixes of its interfaces' addresses and of its routes (the default
// route aside), so that sandboxes can be kept off the host's LAN and
// whatever else it reaches directly, which the fixed private ranges do not
// cover when the host sits on public or unusual addresses. Interfaces
// and routes of network slots (names starting with tag) are left out.
func DetectHostNetworks(tag string) ([]netip.Prefix, error) {
	nets, err := hostNets(tag)
	if err != nil {
		return nil, err
	}
	var out []netip.Prefix
	for _, n := range nets {
		if !slices.Contains(out, n.prefix) {
			out = append(out, n.prefix)
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	return out, nil
}

// hostNet is a network the host is on, and the interface it is on.
type hostNet struct {
	prefix netip.Prefix
	link   string
}

// hostNets lists the masked IPv4 prefixes of the host's addresses and
// routes (the default route, loopback and local or broadcast routes
// aside), leaving out those on interfaces whose names start with tag.
func hostNets(tag string) ([]hostNet, error) {
	links, err := linkList()
	if err != nil {
		return nil, fmt.Errorf("listing interfaces: %w", err)
	}
	skip := map[int]bool{}
	names := map[int]string{}
	for _, l := range links {
		a := l.Attrs()
		names[a.Index] = a.Name
		if a.Flags&unix.IFF_LOOPBACK != 0 || (tag != "" && strings.HasPrefix(a.Name, tag)) {
			skip[a.Index] = true
		}
	}
	var out []hostNet
	add := func(ip net.IP, bits, link int) {
		a, ok := netip.AddrFromSlice(ip)
		if !ok || skip[link] {
			return
		}
		p := netip.PrefixFrom(a.Unmap(), bits)
		if p.Addr().Is4() && p.Bits() > 0 {
			out = append(out, hostNet{prefix: p.Masked(), link: names[link]})
		}
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("listing addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IPNet != nil {
			bits, _ := a.Mask.Size()
			add(a.IP, bits, a.LinkIndex)
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("listing routes: %w", err)
	}
	for _, r := range routes {
		if r.Dst != nil && r.Type != unix.RTN_LOCAL && r.Type != unix.RTN_BROADCAST {
			bits, _ := r.Dst.Mask.Size()
			add(r.Dst.IP, bits, r.LinkIndex)
		}
	}
	return out, nil
}

// checkPrefixFree fails with ErrPrefixInUse when a network of the host
// that is not one of cfg's slots lies within cfg.Prefix: another
// manager's slots (another aenv server given the same range) or a network
// of the host's. Its routes would be as specific as the slots' own, so
// that some sandboxes' traffic would reach the other network's hosts: they
// would answer (or not) for envd, which looks like a sandbox that never
// starts. A wider network around the prefix (a VPC's 10.0.0.0/8) is no
// conflict: the slots' /30 routes win over it.
func checkPrefixFree(cfg Config) error {
	nets, err := hostNets(cfg.Tag)
	if err != nil {
		return fmt.Errorf("checking that %s is free: %w", cfg.Prefix, err)
	}
	for _, n := range nets {
		if n.prefix.Bits() >= cfg.Prefix.Bits() && cfg.Prefix.Contains(n.prefix.Addr()) {
			return fmt.Errorf("%w: %s is on interface %s (another aenv server's sandboxes, or a network of this host's); give each server a range of its own (--sandbox-cidr)",
				ErrPrefixInUse, n.prefix, n.link)
		}
	}
	return nil
}

// WatchHostNetworks calls fn with the host's networks (DetectHostNetworks)
// whenever its addresses or routes change, until ctx ends. Changes come in
// bursts (an interface going up adds an address and several routes), so
// fn runs once a burst has settled.
func WatchHostNetworks(ctx context.Context, tag string, fn func([]netip.Prefix)) error {
	addrs := make(chan netlink.AddrUpdate, 64)
	routes := make(chan netlink.RouteUpdate, 64)
	done := make(chan struct{})
	if err := netlink.AddrSubscribe(addrs, done); err != nil {
		return fmt.Errorf("watching addresses: %w", err)
	}
	if err := netlink.RouteSubscribe(routes, done); err != nil {
		close(done)
		return fmt.Errorf("watching routes: %w", err)
	}
	go func() {
		defer close(done)
		last, _ := DetectHostNetworks(tag)
		var settle <-chan time.Time
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-addrs:
				if !ok {
					return
				}
				settle = time.After(500 * time.Millisecond)
			case _, ok := <-routes:
				if !ok {
					return
				}
				settle = time.After(500 * time.Millisecond)
			case <-settle:
				settle = nil
				now, err := DetectHostNetworks(tag)
				if err == nil && !slices.Equal(now, last) {
					last = now
					fn(now)
				}
			}
		}
	}()
	return nil
}

// SetHostNetworks replaces the host networks no sandbox may reach
// (Config.HostNetworks) in the host's rules, atomically, for every slot.
// Slots built from now on get them in their routers' rules too.
func (m *Manager) SetHostNetworks(ps []netip.Prefix) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("setting host networks: %w", ErrClosed)
	}
	m.cfg.HostNetworks = slices.Clone(ps)
	if err := installHostTable(m.cfg); err != nil {
		return fmt.Errorf("setting host networks: %w", err)
	}
	m.log.Info("sandboxes are kept off the host's networks", "networks", ps)
	return nil
}

// linkList lists the host's interfaces, again when the kernel says links
// changed during the dump (netlink.ErrDumpInterrupted: the list may miss
// some), as they do while namespaces of slots being reaped are freed.
func linkList() ([]netlink.Link, error) {
	for attempt := 1; ; attempt++ {
		links, err := netlink.LinkList()
		if !errors.Is(err, netlink.ErrDumpInterrupted) || attempt == 5 {
			return links, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
