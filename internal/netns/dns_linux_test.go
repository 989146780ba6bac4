package netns

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/aenvhq/aenv/internal/testutil"
)

// TestDNSServerInBlockedRange checks the one hole in the blocked ranges: a
// configured resolver on a private address is reachable on port 53 by
// sandboxes with egress, and nothing else of it is.
func TestDNSServerInBlockedRange(t *testing.T) {
	testutil.RequireRoot(t)
	inet := newTestNet(t)
	n := inet.addr.As4()[2]
	resolver := netip.AddrFrom4([4]byte{172, 31, n, 53})

	// Give the "internet" namespace the resolver's private address too, and
	// route it there from the host.
	if err := inNetNS(inet.path, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(resolver, 32))})
	}); err != nil {
		t.Fatal(err)
	}
	route := &netlink.Route{Dst: ipNet(netip.PrefixFrom(resolver, 32)), Gw: inet.addr.AsSlice()}
	if err := netlink.RouteAdd(route); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netlink.RouteDel(route) })

	cfg := testConfig(t, 1)
	cfg.DNSServers = []netip.Addr{resolver}
	m, err := newManager(context.Background(), cfg, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(context.Background()) })

	listenIn(t, inet.path, hostPort(resolver, 53), "dns")
	listenIn(t, inet.path, hostPort(resolver, 54), "other")

	open := acquire(t, m, SlotOptions{AllowInternet: true})
	closed := acquire(t, m, SlotOptions{})
	mustReach(t, open.SandboxNSPath, hostPort(resolver, 53), "dns")
	mustNotReach(t, open.SandboxNSPath, hostPort(resolver, 54))
	mustNotReach(t, closed.SandboxNSPath, hostPort(resolver, 53))

	// Without the resolver configured, the private address stays shut.
	plain, _ := newTestManager(t, 1)
	s := acquire(t, plain, SlotOptions{AllowInternet: true})
	mustNotReach(t, s.SandboxNSPath, net.JoinHostPort(resolver.String(), "53"))
}
