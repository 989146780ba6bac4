package netns

import (
	"net/netip"
	"slices"
	"testing"
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
