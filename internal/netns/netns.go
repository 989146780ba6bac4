package netns

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/aenvhq/aenv/internal/egress"
)

// Defaults applied by NewManager to zero fields of Config.
const (
	DefaultRunDir   = "/run/aenv/netns"
	DefaultPrefix   = "10.231.0.0/16"
	DefaultTag      = "aenv"
	DefaultPoolSize = 4
)

// Names of the interfaces inside a slot. They live in the slot's own
// namespaces, so they are the same in every slot.
const (
	// SandboxIfName is the sandbox's only interface besides lo.
	SandboxIfName = "eth0"
	routerSandbox = "sandbox" // router side of eth0's veth
	routerUplink  = "uplink"  // router side of the veth to the host
)

// The fixed addressing inside every slot. A /30 leaves room for exactly the
// sandbox and its gateway.
var (
	sandboxAddr   = netip.MustParseAddr("169.254.0.21")
	gatewayAddr   = netip.MustParseAddr("169.254.0.22")
	sandboxPrefix = netip.PrefixFrom(sandboxAddr, 30)
	gatewayPrefix = netip.PrefixFrom(gatewayAddr, 30)
	// Fixed MACs on both ends of eth0's veth: a restored snapshot carries
	// gVisor's (or a guest kernel's) neighbour cache, which must still be
	// right in whatever slot it lands in. Locally administered, unicast.
	sandboxMAC = net.HardwareAddr{0x02, 0xae, 0x00, 0x00, 0x00, 0x21}
	gatewayMAC = net.HardwareAddr{0x02, 0xae, 0x00, 0x00, 0x00, 0x22}
)

// blockedPrefixes are never reachable from a sandbox, whatever its egress
// options say: other sandboxes, the host's networks, cloud metadata
// (169.254.169.254), loopback and multicast.
var blockedPrefixes = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/3"), // multicast, reserved, broadcast
}

// blocked is blockedPrefixes plus the slots' own range, in case it lies
// outside them, and the host's networks that EgressAllow does not exempt.
func (cfg Config) blocked() []netip.Prefix {
	out := slices.Clone(blockedPrefixes)
	if !covered(out, cfg.Prefix) {
		out = append(out, cfg.Prefix)
	}
	for _, p := range cfg.HostNetworks {
		if !covered(out, p) && !covered(cfg.EgressAllow, p) {
			out = append(out, p)
		}
	}
	return out
}

// refuses reports whether no sandbox may reach a, whatever its egress
// options: a is in a blocked range or is a cluster member's (cfg as
// withDefaults or SetClusterAddrs left it: ClusterAddrs sorted).
func (cfg Config) refuses(a netip.Addr) bool {
	a = a.Unmap()
	for _, b := range cfg.blocked() {
		if b.Contains(a) {
			return true
		}
	}
	_, found := slices.BinarySearchFunc(cfg.ClusterAddrs, a, netip.Addr.Compare)
	return found
}

// uniqueAddrs returns addrs unmapped, sorted and without repeats.
func uniqueAddrs(addrs []netip.Addr) []netip.Addr {
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			out = append(out, a.Unmap())
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// covered reports whether p lies wholly inside one of ps.
func covered(ps []netip.Prefix, p netip.Prefix) bool {
	for _, q := range ps {
		if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// Errors returned by the Manager; match them with errors.Is.
var (
	// ErrClosed: the Manager has been closed.
	ErrClosed = errors.New("netns manager closed")
	// ErrExhausted: every slot index of Config.Prefix is in use.
	ErrExhausted = errors.New("no free network slot")
	// ErrBusy: another Manager holds Config.RunDir.
	ErrBusy = errors.New("netns run directory in use by another manager")
	// ErrNotHeld: the slot was not acquired from this Manager, or was
	// already released.
	ErrNotHeld = errors.New("slot not held by this manager")
	// ErrPrefixInUse: a network of the host (another manager's slots,
	// or an interface's) lies within Config.Prefix.
	ErrPrefixInUse = errors.New("sandbox address range in use on this host")
	// ErrUnsupported: network slots need Linux.
	ErrUnsupported = errors.New("network slots are only supported on linux")
)

// Config configures a Manager. Zero fields take the Default* values.
type Config struct {
	// RunDir holds the bind-mounted namespace files. The Manager owns it:
	// everything in it is removed by Reap.
	RunDir string
	// Prefix is the IPv4 range cut into one /30 per slot (host side .1,
	// router side .2 of each). It must not be used by anything else on the
	// host: NewManager refuses one that is (ErrPrefixInUse).
	Prefix netip.Prefix
	// Tag names the nftables tables (host and router) and prefixes the
	// host-side interface names (Tag + slot index). Lower-case letters only,
	// at most 10. Managers on one host need distinct tags, none a prefix of
	// another, and distinct prefixes: Reap removes everything of its tag.
	Tag string
	// PoolSize is how many ready slots are kept; negative disables the pool.
	PoolSize int
	// DNSServers may be reached on port 53 (UDP and TCP) by sandboxes with
	// egress, even inside the always-blocked ranges: a host's resolver is
	// often on a private address (a cloud VPC's, a LAN's).
	DNSServers []netip.Addr
	// Logger receives background errors (pool refill); nil discards.
	Logger *slog.Logger
	// HostNetworks are the networks the host itself is on (see
	// DetectHostNetworks): no sandbox may reach them, whatever its egress
	// options, except where EgressAllow covers them. SetHostNetworks
	// changes them while the Manager runs.
	HostNetworks []netip.Prefix
	// EgressAllow exempts ranges of HostNetworks from that block (an
	// operator's choice, e.g. a test network); a sandbox still reaches
	// them only as its own egress options allow. The always-blocked
	// ranges stay blocked.
	EgressAllow []netip.Prefix
	// ClusterAddrs are the addresses of the cluster's members (servers,
	// nodes, etcd members): no sandbox may reach them, on any port but
	// the DNSServers' 53, whatever its egress options, and EgressAllow
	// does not exempt them (a host the cluster runs on is never a
	// sandbox's to reach); only IPv4 ones matter, as sandboxes have no
	// IPv6 route. SetClusterAddrs changes them while the Manager runs.
	ClusterAddrs []netip.Addr
	// OnEgressRefused, if set, hears of each connection a slot's egress
	// proxy refused (by domain); refusals by address are counted instead
	// (RefusedCount).
	OnEgressRefused func(s *Slot, r egress.Refusal)
	// KeepLeftovers makes NewManager keep the intact slots a previous
	// manager of this RunDir left (their sandboxes may still run after a
	// restart) instead of reaping them: Adopt takes them back, and
	// ReleaseLeftovers destroys the rest.
	KeepLeftovers bool
}

// withDefaults returns cfg with zero fields filled in and checks it.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.RunDir == "" {
		cfg.RunDir = DefaultRunDir
	}
	if !cfg.Prefix.IsValid() {
		cfg.Prefix = netip.MustParsePrefix(DefaultPrefix)
	}
	if cfg.Tag == "" {
		cfg.Tag = DefaultTag
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = DefaultPoolSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.ClusterAddrs = uniqueAddrs(cfg.ClusterAddrs)
	for _, a := range cfg.DNSServers {
		if !a.Is4() {
			return cfg, fmt.Errorf("checking config: DNS server %s is not IPv4", a)
		}
	}
	if !cfg.Prefix.Addr().Is4() || cfg.Prefix.Bits() > 30 || cfg.Prefix.Masked() != cfg.Prefix {
		return cfg, fmt.Errorf("checking config: prefix %s must be a masked IPv4 prefix of /30 or wider", cfg.Prefix)
	}
	if len(cfg.Tag) > 10 {
		return cfg, fmt.Errorf("checking config: tag %q longer than 10 letters", cfg.Tag)
	}
	for _, c := range cfg.Tag {
		if c < 'a' || c > 'z' {
			return cfg, fmt.Errorf("checking config: tag %q must be lower-case letters only", cfg.Tag)
		}
	}
	return cfg, nil
}

// slotCount is how many slots cfg's prefix holds, capped so that every
// host-side interface name (Tag + index) fits the kernel's 15 bytes.
func (cfg Config) slotCount() int {
	n := 1 << (30 - cfg.Prefix.Bits())
	digits := 15 - len(cfg.Tag)
	if digits < 9 {
		limit := 1
		for range digits {
			limit *= 10
		}
		n = min(n, limit)
	}
	return n
}

// slotName is the slot's name, which is also its host-side interface name.
func (cfg Config) slotName(index int) string { return cfg.Tag + strconv.Itoa(index) }

// slotIndex parses a name made by slotName; ok is false for any other name.
func (cfg Config) slotIndex(name string) (index int, ok bool) {
	rest, found := strings.CutPrefix(name, cfg.Tag)
	if !found || rest == "" || (len(rest) > 1 && rest[0] == '0') {
		return 0, false
	}
	for _, c := range rest {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil
}

// slotAddrs returns the uplink addresses of slot index: host is the host
// side (the router's gateway), router the router side (the slot's HostAddr).
func (cfg Config) slotAddrs(index int) (host, router netip.Prefix) {
	base := cfg.Prefix.Addr().As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(index) * 4
	mk := func(off uint32) netip.Prefix {
		a := v + off
		return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), 30)
	}
	return mk(1), mk(2)
}

// SlotOptions are the per-sandbox network settings applied by Acquire and
// UpdateEgress. The zero value allows no outbound connections at all.
type SlotOptions struct {
	// AllowInternet lets the sandbox open connections to any address
	// outside the always-blocked ranges (E2B's allow_internet_access).
	AllowInternet bool
	// AllowOut lists destinations the sandbox may connect to even when
	// AllowInternet is false; it wins over DenyOut. The always-blocked
	// ranges stay blocked.
	AllowOut []netip.Prefix
	// DenyOut lists destinations the sandbox may not connect to even when
	// AllowInternet is true.
	DenyOut []netip.Prefix
	// AllowDomains are names (and *.wildcards) the sandbox may reach over
	// HTTP and TLS even where the address rules deny it; with any, its
	// connections to ports 80 and 443 go through the slot's egress proxy.
	AllowDomains []string
}

func (o SlotOptions) denyAll() bool {
	return !o.AllowInternet && len(o.AllowOut) == 0 && len(o.AllowDomains) == 0
}

// Equal reports whether o and p are the same rules.
func (o SlotOptions) Equal(p SlotOptions) bool {
	return o.AllowInternet == p.AllowInternet && slices.Equal(o.AllowOut, p.AllowOut) &&
		slices.Equal(o.DenyOut, p.DenyOut) && slices.Equal(o.AllowDomains, p.AllowDomains)
}

// Slot is one sandbox's network. Its fields are read-only; the Manager that
// returned it owns it until Release or Recycle.
type Slot struct {
	// Name identifies the slot on this host and names its host-side
	// interface; it is reused after the slot is released.
	Name string
	// Index is the slot's position in Config.Prefix.
	Index int
	// SandboxNSPath is the sandbox namespace (lo and eth0), for the OCI
	// spec's network namespace path.
	SandboxNSPath string
	// RouterNSPath is the router namespace, for inspection and for
	// dialing the sandbox from inside the slot.
	RouterNSPath string
	// HostAddr is the slot's unique address: dial it from the host to reach
	// any port of the sandbox.
	HostAddr netip.Addr
	// SandboxAddr is eth0's address inside the sandbox, with its prefix
	// length; the same in every slot.
	SandboxAddr netip.Prefix
	// Gateway is the sandbox's default route; the same in every slot.
	Gateway netip.Addr
	// SandboxMAC and GatewayMAC are the fixed hardware addresses of eth0
	// and of its peer (for guests that configure their own kernel).
	SandboxMAC, GatewayMAC net.HardwareAddr

	hostIf    string       // host-side interface name (== Name)
	hostIndex int          // and its ifindex
	hostPeer  netip.Prefix // host side of the uplink, the router's gateway
	uplink    netip.Prefix // HostAddr with its prefix length

	// proxy is the slot's egress proxy while it has domain rules; its
	// owner's updates and its release may race, hence proxyMu.
	proxy   *slotProxy
	proxyMu sync.Mutex

	// nft is an nftables connection into the router namespace, kept while
	// the slot waits in the pool so that Acquire need not open one. The
	// slot's current owner (pool, or Acquire in progress) uses it.
	nft nftConn
}

func (cfg Config) newSlot(index int) *Slot {
	host, router := cfg.slotAddrs(index)
	name := cfg.slotName(index)
	return &Slot{
		Name:          name,
		Index:         index,
		SandboxNSPath: cfg.RunDir + "/" + name,
		RouterNSPath:  cfg.RunDir + "/" + name + ".router",
		HostAddr:      router.Addr(),
		SandboxAddr:   sandboxPrefix,
		Gateway:       gatewayAddr,
		SandboxMAC:    slices.Clone(sandboxMAC),
		GatewayMAC:    slices.Clone(gatewayMAC),
		hostIf:        name,
		hostPeer:      host,
		uplink:        router,
	}
}
