package netns

import (
	"bufio"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

// TestClusterAddrsRefused: a cluster member's address is refused to
// every slot, at once and on any port, whatever the slot's egress rules
// and the operator's EgressAllow say, from the moment it is set (slots
// already running included) until it is taken out again.
func TestClusterAddrsRefused(t *testing.T) {
	m, cfg := newTestManager(t, 0)
	inet := newTestNet(t)
	member := hostPort(inet.addr, 8080)
	other := hostPort(inet.addr, 9090)
	listenIn(t, inet.path, member, "member")
	listenIn(t, inet.path, other, "other")
	nets, err := DetectHostNetworks(cfg.Tag)
	if err != nil {
		t.Fatal(err)
	}
	// The operator opened the test network, which the host is on.
	m.mu.Lock()
	m.cfg.EgressAllow = []netip.Prefix{inet.prefix}
	m.mu.Unlock()
	if err := m.SetHostNetworks(nets); err != nil {
		t.Fatal(err)
	}
	open := acquire(t, m, SlotOptions{AllowInternet: true})
	allowed := acquire(t, m, SlotOptions{AllowOut: []netip.Prefix{netip.PrefixFrom(inet.addr, 32)}})
	for _, s := range []*Slot{open, allowed} {
		mustReach(t, s.SandboxNSPath, member, "member")
	}
	var held net.Conn
	if err := inNetNS(open.SandboxNSPath, func() (err error) {
		held, err = net.DialTimeout("tcp4", member, 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	r := bufio.NewReader(held)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}

	if err := m.SetClusterAddrs([]netip.Addr{netip.MustParseAddr("203.0.113.1"), inet.addr}); err != nil {
		t.Fatal(err)
	}
	// A connection open before is cut at its next packet.
	held.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(held, "ping\n"); err == nil {
		if echo, err := r.ReadString('\n'); err == nil {
			t.Fatalf("a connection to a member opened before it was one still answers %q", echo)
		}
	}
	later := acquire(t, m, SlotOptions{AllowInternet: true, AllowOut: []netip.Prefix{inet.prefix}})
	for _, s := range []*Slot{open, allowed, later} {
		mustBeRefused(t, s.SandboxNSPath, member)
		mustBeRefused(t, s.SandboxNSPath, other)
	}
	// Host networks change: the table is laid again, the members with it.
	if err := m.SetHostNetworks(nets); err != nil {
		t.Fatal(err)
	}
	mustBeRefused(t, open.SandboxNSPath, member)

	if err := m.SetClusterAddrs(nil); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Slot{open, allowed, later} {
		mustReach(t, s.SandboxNSPath, member, "member")
	}
}
