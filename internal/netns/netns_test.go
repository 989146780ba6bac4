package netns

import (
	"net/netip"
	"slices"
	"testing"
)

func TestAddressPlan(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		index        int
		host, router string
	}{
		{0, "10.231.0.1/30", "10.231.0.2/30"},
		{1, "10.231.0.5/30", "10.231.0.6/30"},
		{64, "10.231.1.1/30", "10.231.1.2/30"},
		{16383, "10.231.255.253/30", "10.231.255.254/30"},
	} {
		host, router := cfg.slotAddrs(tc.index)
		if host.String() != tc.host || router.String() != tc.router {
			t.Errorf("slot %d: host %s router %s, want %s %s", tc.index, host, router, tc.host, tc.router)
		}
		s := cfg.newSlot(tc.index)
		if s.HostAddr != router.Addr() || !cfg.Prefix.Contains(s.HostAddr) {
			t.Errorf("slot %d: HostAddr %s", tc.index, s.HostAddr)
		}
	}
	if got := cfg.slotCount(); got != 16384 {
		t.Errorf("slotCount = %d, want 16384", got)
	}
}

func TestSlotNames(t *testing.T) {
	cfg, err := Config{Tag: "abcdefghij", Prefix: netip.MustParsePrefix("10.0.0.0/8")}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	// A 10-letter tag leaves 5 digits, whatever the prefix offers.
	if got := cfg.slotCount(); got != 100000 {
		t.Errorf("slotCount = %d, want 100000", got)
	}
	if name := cfg.slotName(cfg.slotCount() - 1); len(name) > 15 {
		t.Errorf("name %q longer than IFNAMSIZ-1", name)
	}
	for name, want := range map[string]int{"abcdefghij0": 0, "abcdefghij42": 42} {
		if i, ok := cfg.slotIndex(name); !ok || i != want {
			t.Errorf("slotIndex(%q) = %d, %v", name, i, ok)
		}
	}
	for _, name := range []string{"abcdefghij", "abcdefghij01", "abcdefghijx1", "abcdefghij1.router", "eth0", "abcdefghi1"} {
		if _, ok := cfg.slotIndex(name); ok {
			t.Errorf("slotIndex(%q) accepted", name)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, cfg := range []Config{
		{Prefix: netip.MustParsePrefix("10.231.0.0/31")},
		{Prefix: netip.MustParsePrefix("10.231.0.1/16")},
		{Prefix: netip.MustParsePrefix("fd00::/64")},
		{Tag: "Aenv"},
		{Tag: "aenv-1"},
		{Tag: "abcdefghijk"},
	} {
		if _, err := cfg.withDefaults(); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.RunDir != DefaultRunDir || cfg.Tag != DefaultTag || cfg.PoolSize != DefaultPoolSize || cfg.Logger == nil ||
		cfg.Prefix.String() != DefaultPrefix {
		t.Errorf("defaults not applied: %+v", cfg)
	}
}

func TestBlockedPrefixesCoverTheBrief(t *testing.T) {
	for _, a := range []string{"10.1.2.3", "172.16.0.1", "172.31.255.255", "192.168.1.1", "100.64.0.1",
		"169.254.169.254", "127.0.0.1", "224.0.0.1", "255.255.255.255", "0.0.0.0"} {
		addr := netip.MustParseAddr(a)
		blocked := false
		for _, p := range blockedPrefixes {
			blocked = blocked || p.Contains(addr)
		}
		if !blocked {
			t.Errorf("%s is not blocked", a)
		}
	}
	for _, a := range []string{"8.8.8.8", "198.18.0.1", "1.1.1.1", "172.32.0.1"} {
		for _, p := range blockedPrefixes {
			if p.Contains(netip.MustParseAddr(a)) {
				t.Errorf("%s is blocked by %s", a, p)
			}
		}
	}
	def, _ := Config{}.withDefaults()
	if len(def.blocked()) != len(blockedPrefixes) {
		t.Errorf("default prefix %s is not inside a blocked range", def.Prefix)
	}
	odd, _ := Config{Prefix: netip.MustParsePrefix("198.19.0.0/16")}.withDefaults()
	if b := odd.blocked(); b[len(b)-1] != odd.Prefix {
		t.Errorf("a slot prefix outside the blocked ranges is not blocked: %v", b)
	}
}

// TestRefusesClusterMembers: a cluster member's address is refused to
// every sandbox whatever the operator exempted, and only that address.
func TestRefusesClusterMembers(t *testing.T) {
	member := netip.MustParseAddr("198.18.7.2")
	cfg, err := Config{
		HostNetworks: []netip.Prefix{netip.MustParsePrefix("198.18.7.0/30")},
		EgressAllow:  []netip.Prefix{netip.MustParsePrefix("198.18.7.0/30")},
		ClusterAddrs: []netip.Addr{netip.MustParseAddr("203.0.113.9"), netip.MustParseAddr("::ffff:198.18.7.2"), member},
	}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Addr{member, netip.MustParseAddr("203.0.113.9")}; !slices.Equal(cfg.ClusterAddrs, want) {
		t.Fatalf("ClusterAddrs = %v, want %v (unmapped, sorted, once)", cfg.ClusterAddrs, want)
	}
	for a, want := range map[string]bool{
		"198.18.7.2": true, "::ffff:198.18.7.2": true, "203.0.113.9": true, "10.0.0.1": true,
		"198.18.7.1": false, "203.0.113.10": false, "8.8.8.8": false,
	} {
		if got := cfg.refuses(netip.MustParseAddr(a)); got != want {
			t.Errorf("refuses(%s) = %v, want %v", a, got, want)
		}
	}
}
