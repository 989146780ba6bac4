package nodeapi

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TestParseEgressRules: addresses and CIDRs become prefixes (masked),
// names become domains, and what is neither is refused naming the entry.
func TestParseEgressRules(t *testing.T) {
	r, err := ParseEgressRules([]string{"10.1.2.3", "192.168.7.9/16", "*.example.com"}, []string{"8.8.8.8/32"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.1.2.3/32"), netip.MustParsePrefix("192.168.0.0/16")}
	if !slices.Equal(r.AllowOut, want) || !slices.Equal(r.DenyOut, []netip.Prefix{netip.MustParsePrefix("8.8.8.8/32")}) ||
		len(r.AllowDomains) != 1 {
		t.Fatalf("parsed %+v", r)
	}
	for _, c := range []struct{ allow, deny []string }{
		{allow: []string{"not a name!"}},
		{deny: []string{"example.com"}},
		{deny: []string{"::1"}},
	} {
		if _, err := ParseEgressRules(c.allow, c.deny); err == nil || !strings.Contains(err.Error(), "entry") {
			t.Errorf("ParseEgressRules(%q, %q) = %v, want an error naming the entry", c.allow, c.deny, err)
		}
	}
}
