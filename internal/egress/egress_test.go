package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestRules(t *testing.T) {
	r := Rules{
		AllowDomains: []string{"example.com", "*.allowed.test"},
		AllowOut:     []netip.Prefix{netip.MustParsePrefix("203.0.113.7/32")},
		DenyOut:      []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")},
	}
	for name, want := range map[string]bool{
		"example.com": true, "EXAMPLE.com.": true, "www.example.com": false,
		"a.allowed.test": true, "a.b.allowed.test": true, "allowed.test": false, "": false, "evil.test": false,
	} {
		if got := r.AllowsDomain(name); got != want {
			t.Errorf("AllowsDomain(%q) = %v, want %v", name, got, want)
		}
	}
	if !r.AllowsAddr(netip.MustParseAddr("203.0.113.7")) || r.AllowsAddr(netip.MustParseAddr("203.0.113.8")) {
		t.Error("allowOut must win over denyOut 0.0.0.0/0, and nothing else pass")
	}
	open := Rules{AllowInternet: true, DenyOut: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}}
	if !open.AllowsAddr(netip.MustParseAddr("8.8.8.8")) || open.AllowsAddr(netip.MustParseAddr("198.51.100.1")) {
		t.Error("denyOut must refuse its range and the internet stay open")
	}
	for _, bad := range []string{"*", "a..b", "-a.com", "a_b.com", "*.*.com", strings.Repeat("a", 64) + ".com", "http://x.com"} {
		if _, err := ParseDomain(bad); err == nil {
			t.Errorf("ParseDomain(%q) accepted it", bad)
		}
	}
	if d, err := ParseDomain(" *.Example.COM. "); err != nil || d != "*.example.com" {
		t.Errorf("ParseDomain: %q %v", d, err)
	}
}

// TestPeekName reads the name from a real TLS ClientHello (made by
// crypto/tls) and from an HTTP request, keeping every byte for replay.
func TestPeekName(t *testing.T) {
	a, b := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{ServerName: "api.allowed.test", InsecureSkipVerify: true}).Handshake()
	}()
	var seen bytes.Buffer
	br := bufio.NewReader(teeConn{b, &seen})
	if name := peekName(br, &seen); name != "api.allowed.test" {
		t.Fatalf("SNI %q", name)
	}
	if seen.Len() == 0 || seen.Bytes()[0] != 0x16 {
		t.Fatal("the ClientHello was not kept for replay")
	}
	a.Close()
	b.Close()

	req := "GET /x HTTP/1.1\r\nHost: Example.com:8080\r\nContent-Length: 3\r\n\r\nabc"
	seen.Reset()
	br = bufio.NewReader(teeConn{strings.NewReader(req), &seen})
	if name := peekName(br, &seen); name != "Example.com" {
		t.Fatalf("Host %q", name)
	}
	if seen.String() != req {
		t.Fatalf("kept %q", seen.String())
	}
	seen.Reset()
	br = bufio.NewReader(teeConn{strings.NewReader("GET / HTTP/1.1\r\nHost: 1.2.3.4\r\n\r\n"), &seen})
	if name := peekName(br, &seen); name != "" {
		t.Fatalf("an address as Host gave the name %q", name)
	}
	seen.Reset()
	br = bufio.NewReader(teeConn{strings.NewReader("\x00\x01garbage"), &seen})
	if name := peekName(br, &seen); name != "" {
		t.Fatalf("garbage gave the name %q", name)
	}
}

type teeConn struct {
	r interface{ Read([]byte) (int, error) }
	w *bytes.Buffer
}

func (t teeConn) Read(b []byte) (int, error) {
	n, err := t.r.Read(b)
	t.w.Write(b[:n])
	return n, err
}
