package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestHostNetworksBlocked: the networks the host is on are detected (here
// the test internet's veth, on the host), kept from sandboxes with egress
// on, and given back by EgressAllow.
func TestHostNetworksBlocked(t *testing.T) {
	m, cfg := newTestManager(t, 0)
	inet := newTestNet(t)
	target := hostPort(inet.addr, 8080)
	listenIn(t, inet.path, target, "internet")
	open := acquire(t, m, SlotOptions{AllowInternet: true})
	mustReach(t, open.SandboxNSPath, target, "internet")

	nets, err := DetectHostNetworks(cfg.Tag)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(nets, inet.prefix) {
		t.Fatalf("DetectHostNetworks = %v, lacks the host's %s", nets, inet.prefix)
	}
	for _, p := range nets {
		if covered([]netip.Prefix{cfg.Prefix}, p) {
			t.Errorf("the slots' own network %s is listed as the host's", p)
		}
	}
	if err := m.SetHostNetworks(nets); err != nil {
		t.Fatal(err)
	}
	mustNotReach(t, open.SandboxNSPath, target)
	// A slot built afterwards has the block in its router too, and an
	// allow-list entry does not open it.
	later := acquire(t, m, SlotOptions{AllowInternet: true, AllowOut: []netip.Prefix{inet.prefix}})
	mustNotReach(t, later.SandboxNSPath, target)

	// The operator's EgressAllow exempts it.
	m.mu.Lock()
	m.cfg.EgressAllow = []netip.Prefix{inet.prefix}
	m.mu.Unlock()
	if err := m.SetHostNetworks(nets); err != nil {
		t.Fatal(err)
	}
	mustReach(t, open.SandboxNSPath, target, "internet")
}

// TestPrefixInUseRefused: a manager does not start on a range another
// manager's slots (another tag) already use, saying where, and starts on
// a range around which the host only has a wider network.
func TestPrefixInUseRefused(t *testing.T) {
	m, cfg := newTestManager(t, 0)
	acquire(t, m, SlotOptions{})

	other := testConfig(t, 0)
	other.Prefix = cfg.Prefix
	_, err := NewManager(context.Background(), other)
	if !errors.Is(err, ErrPrefixInUse) {
		t.Fatalf("a second manager on %s: got %v, want ErrPrefixInUse", cfg.Prefix, err)
	}
	if !strings.Contains(err.Error(), "/30 is on interface "+cfg.Tag) {
		t.Errorf("error %q names neither a slot's network nor its interface", err)
	}

	// The same range but wider, from the first manager's point of view:
	// its /30s lie within.
	wider := testConfig(t, 0)
	wider.Prefix = netip.PrefixFrom(cfg.Prefix.Addr(), cfg.Prefix.Bits()-1).Masked()
	if _, err := NewManager(context.Background(), wider); !errors.Is(err, ErrPrefixInUse) {
		t.Fatalf("a manager on %s around %s's slots: got %v, want ErrPrefixInUse", wider.Prefix, cfg.Prefix, err)
	}

	// A wider network of the host's around a manager's range is no
	// conflict: the slots' /30 routes are more specific.
	inside := testConfig(t, 0)
	inside.Prefix = netip.PrefixFrom(inside.Prefix.Addr(), 28)
	veth := addTestAddr(t, netip.PrefixFrom(inside.Prefix.Addr(), 23).Masked())
	m2, err := NewManager(context.Background(), inside)
	if err != nil {
		t.Fatalf("a manager on %s inside %s (on %s): %v", inside.Prefix, netip.PrefixFrom(inside.Prefix.Addr(), 23).Masked(), veth, err)
	}
	if err := m2.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// addTestAddr puts p's address on an interface of the host's (a veth
// whose peer stays on the host too; this kernel has no dummy interfaces)
// until the test ends, and returns the interface's name.
func addTestAddr(t testing.TB, p netip.Prefix) string {
	t.Helper()
	la := netlink.NewLinkAttrs()
	n := testSeq.Add(1)
	la.Name = fmt.Sprintf("xaddr%d", n)
	link := &netlink.Veth{LinkAttrs: la, PeerName: fmt.Sprintf("xpeer%d", n)}
	if err := netlink.LinkAdd(link); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteLink(la.Name) })
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(p)}); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	return la.Name
}
