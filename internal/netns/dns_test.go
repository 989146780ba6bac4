package netns

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestHostDNSServers(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, "resolv.conf")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		conf string
		want []string
	}{
		{"nameserver 10.255.255.53\nsearch x\n", []string{"10.255.255.53"}},
		{"# c\nnameserver 127.0.0.53\nnameserver 8.8.8.8\nnameserver ::1\n", []string{"8.8.8.8"}},
		{"nameserver 127.0.0.53\n", []string{"1.1.1.1"}},
		{"", []string{"1.1.1.1"}},
	}
	for _, tc := range cases {
		var got []string
		for _, a := range HostDNSServers(write(tc.conf)) {
			got = append(got, a.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %v, want %v", tc.conf, got, tc.want)
		}
	}
	if got := HostDNSServers(filepath.Join(dir, "missing")); !slices.Equal(got, []netip.Addr{fallbackDNS}) {
		t.Errorf("missing file: got %v", got)
	}
}
