package egress

import (
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OriginalDst is where a connection redirected by nftables (redirect or
// dnat in the namespace the listener is in) was headed: conntrack's
// SO_ORIGINAL_DST, which x/sys/unix does not wrap (its answer is a
// sockaddr_in read through the IPv6 mreq type of the same size).
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("original destination: not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		mreq, err := unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
		if err != nil {
			serr = err
			return
		}
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&mreq.Multiaddr[0]))
		pb := (*[2]byte)(unsafe.Pointer(&sa.Port)) // network byte order
		out = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(pb[0])<<8|uint16(pb[1]))
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("original destination: %w", err)
	}
	return out, nil
}
