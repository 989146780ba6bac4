package netns

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// loopbackIndex is lo's ifindex in every network namespace.
const loopbackIndex = 1

// errLeftovers marks a failed build that could not undo all it did.
var errLeftovers = errors.New("could not undo everything")

// buildSlot creates slot index from nothing: both namespaces, their files,
// the router's rules (first, so the router never forwards unfiltered), the
// two veth pairs and the addresses and routes. On error everything it made
// is undone.
func buildSlot(cfg Config, index int) (_ *Slot, err error) {
	s := cfg.newSlot(index)
	var undo []func() error
	defer func() {
		if err == nil {
			return
		}
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](); uerr != nil {
				err = errors.Join(err, errLeftovers, uerr)
			}
		}
	}()
	wrap := func(err error) error { return fmt.Errorf("building slot %s: %w", s.Name, err) }

	nss, err := newNamespaces()
	if err != nil {
		return nil, wrap(err)
	}
	defer func() { nss.close() }() // the bind mounts keep the namespaces alive
	if err := bindNS(nss.router, s.RouterNSPath); err != nil {
		return nil, wrap(err)
	}
	undo = append(undo, func() error { return unbindNS(s.RouterNSPath) })
	if err := bindNS(nss.sandbox, s.SandboxNSPath); err != nil {
		return nil, wrap(err)
	}
	undo = append(undo, func() error { return unbindNS(s.SandboxNSPath) })

	if err := installRouterTable(nss.routerNFT, cfg, s); err != nil {
		return nil, wrap(err)
	}

	// Host <-> router: created from the host, peer born in the router.
	hostAttrs := netlink.NewLinkAttrs()
	hostAttrs.Name = s.hostIf
	hostAttrs.Flags = net.FlagUp
	hostIf := &netlink.Veth{LinkAttrs: hostAttrs, PeerName: routerUplink,
		PeerNamespace: netlink.NsFd(nss.router.Fd())}
	if err := netlink.LinkAdd(hostIf); err != nil {
		return nil, wrap(fmt.Errorf("creating uplink %s: %w", s.hostIf, err))
	}
	s.hostIndex = hostIf.Attrs().Index // LinkAdd looked it up
	undo = append(undo, func() error { return deleteLink(s.hostIf) })
	if err := netlink.AddrAdd(hostIf, &netlink.Addr{IPNet: ipNet(s.hostPeer)}); err != nil {
		return nil, wrap(fmt.Errorf("addressing uplink %s: %w", s.hostIf, err))
	}

	if err := configureRouter(nss.routerNL, s, nss.sandbox); err != nil {
		return nil, wrap(err)
	}
	if err := configureSandbox(nss.sandboxNL, false); err != nil {
		return nil, wrap(err)
	}
	s.nft, nss.routerNFT = nss.routerNFT, nil // kept for Acquire's egress update
	return s, nil
}

// configureRouter creates eth0's veth pair from the router (eth0 born in the
// sandbox namespace) and addresses the router's two interfaces. h is a
// netlink handle in the router namespace.
func configureRouter(h *netlink.Handle, s *Slot, sandboxNS *os.File) error {
	attrs := netlink.NewLinkAttrs()
	attrs.Name = routerSandbox
	attrs.Flags = net.FlagUp
	attrs.HardwareAddr = gatewayMAC
	toSandbox := &netlink.Veth{LinkAttrs: attrs, PeerName: SandboxIfName,
		PeerHardwareAddr: sandboxMAC, PeerNamespace: netlink.NsFd(sandboxNS.Fd())}
	if err := h.LinkAdd(toSandbox); err != nil {
		return fmt.Errorf("creating veth %s/%s: %w", routerSandbox, SandboxIfName, err)
	}
	if err := h.AddrAdd(toSandbox, &netlink.Addr{IPNet: ipNet(gatewayPrefix)}); err != nil {
		return fmt.Errorf("addressing %s: %w", routerSandbox, err)
	}

	uplink, err := h.LinkByName(routerUplink)
	if err != nil {
		return fmt.Errorf("finding %s: %w", routerUplink, err)
	}
	if err := h.LinkSetUp(uplink); err != nil {
		return fmt.Errorf("bringing up %s: %w", routerUplink, err)
	}
	if err := h.AddrAdd(uplink, &netlink.Addr{IPNet: ipNet(s.uplink)}); err != nil {
		return fmt.Errorf("addressing %s: %w", routerUplink, err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: uplink.Attrs().Index, Gw: s.hostPeer.Addr().AsSlice()}); err != nil {
		return fmt.Errorf("adding router default route: %w", err)
	}
	if err := h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loopbackIndex}}); err != nil {
		return fmt.Errorf("bringing up router lo: %w", err)
	}
	return nil
}

// configureSandbox brings up lo and eth0 and gives eth0 the fixed address
// and default route; h is a netlink handle in the sandbox namespace. With
// replace it tolerates (and overwrites) what is already there, which is how
// a used namespace is made ready again.
func configureSandbox(h *netlink.Handle, replace bool) error {
	if err := h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loopbackIndex}}); err != nil {
		return fmt.Errorf("bringing up sandbox lo: %w", err)
	}
	eth0, err := h.LinkByName(SandboxIfName)
	if err != nil {
		return fmt.Errorf("finding %s: %w", SandboxIfName, err)
	}
	if err := h.LinkSetUp(eth0); err != nil {
		return fmt.Errorf("bringing up %s: %w", SandboxIfName, err)
	}
	addr := &netlink.Addr{IPNet: ipNet(sandboxPrefix)}
	route := &netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: gatewayAddr.AsSlice()}
	if replace {
		err = h.AddrReplace(eth0, addr)
	} else {
		err = h.AddrAdd(eth0, addr)
	}
	if err != nil {
		return fmt.Errorf("addressing %s: %w", SandboxIfName, err)
	}
	if replace {
		err = h.RouteReplace(route)
	} else {
		err = h.RouteAdd(route)
	}
	if err != nil {
		return fmt.Errorf("adding sandbox default route: %w", err)
	}
	return nil
}

// detachSlot cuts the slot off and removes its namespace files: it takes
// the host side of the uplink down, so that nothing passes between host and
// slot from here on, and unmounts both namespaces. The kernel then frees
// them, and with the router namespace goes eth0's veth pair, even if some
// process still holds the sandbox namespace. What remains is the host-side
// interface; see deleteLink.
func detachSlot(s *Slot) error {
	s.dropNFT()
	var down error
	if s.hostIndex != 0 {
		err := netlink.LinkSetDown(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: s.hostIndex}})
		if err != nil && !errors.Is(err, unix.ENODEV) {
			down = fmt.Errorf("taking %s down: %w", s.hostIf, err)
		}
	}
	err := errors.Join(down, unbindNS(s.SandboxNSPath), unbindNS(s.RouterNSPath))
	if err != nil {
		return fmt.Errorf("destroying slot %s: %w", s.Name, err)
	}
	return nil
}

// deleteLink deletes a host interface by name; a missing one is fine.
// Deleting a veth takes its peer with it, and waits out RCU grace periods in
// the kernel: 15-40 ms here, mostly idle.
func deleteLink(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		if _, ok := err.(netlink.LinkNotFoundError); ok {
			return nil
		}
		return fmt.Errorf("finding interface %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("deleting interface %s: %w", name, err)
	}
	return nil
}

// nsInUse reports whether any process other than ours has joined the
// namespace at path (found through /proc/<pid>/ns/net). A namespace a
// sandbox might still be running in must never be handed to another one.
func nsInUse(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return false, fmt.Errorf("inspecting namespace %s: %w", path, err)
	}
	want := "net:[" + strconv.FormatUint(st.Ino, 10) + "]"
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return false, fmt.Errorf("listing processes: %w", err)
	}
	self := strconv.Itoa(os.Getpid())
	for _, p := range procs {
		name := p.Name()
		if name[0] < '0' || name[0] > '9' || name == self {
			continue
		}
		if link, err := os.Readlink("/proc/" + name + "/ns/net"); err == nil && link == want {
			return true, nil
		}
	}
	return false, nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

// PacketCount is how many packets have crossed slot s's host-side
// interface, both ways: everything the sandbox sends or receives (the
// host's requests to it, its replies, its egress) passes there, so an
// unchanged count means no traffic at all. The counter is the kernel's,
// read through netlink rather than /sys/class/net, which shows the
// network namespace sysfs was mounted in, not the caller's.
func (m *Manager) PacketCount(s *Slot) (uint64, error) {
	l, err := netlink.LinkByName(s.hostIf)
	if err != nil {
		return 0, fmt.Errorf("reading the packet count of slot %s: %w", s.Name, err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return 0, fmt.Errorf("reading the packet count of slot %s: the kernel gave no statistics", s.Name)
	}
	return st.RxPackets + st.TxPackets, nil
}
