package netns

import (
	"bufio"
	"net/netip"
	"os"
	"strings"
)

// fallbackDNS is used when the host has no resolver a sandbox can reach.
var fallbackDNS = netip.MustParseAddr("1.1.1.1")

// HostDNSServers returns the host's IPv4 name servers from resolv.conf,
// for sandboxes to use (pass them as Config.DNSServers too, so that the
// rules let sandboxes reach them). A loopback resolver (systemd-resolved's
// stub) is unreachable from a sandbox, so it is left out, and with nothing
// left a public resolver stands in.
func HostDNSServers(resolvConf string) []netip.Addr {
	f, err := os.Open(resolvConf)
	if err != nil {
		return []netip.Addr{fallbackDNS}
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		if a, err := netip.ParseAddr(fields[1]); err == nil && a.Is4() && !a.IsLoopback() {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return []netip.Addr{fallbackDNS}
	}
	return out
}
