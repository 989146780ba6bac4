package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
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

// TestProxy runs the proxy over real TCP on loopback, the redirect stood
// in for by origDst: an allowed name is relayed, another is reset at once
// and reported, and closing the listener ends an idle relay too.
func TestProxy(t *testing.T) {
	backend, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Close()
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() {
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err == nil && req.URL.Path == "/idle" {
					return // holds the connection open, saying nothing
				}
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
				c.Close()
			}()
		}
	}()
	dst := netip.MustParseAddrPort(backend.Addr().String())
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan Refusal, 4)
	p := &Proxy{
		Lookup: func(ctx context.Context, name string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		},
		OnRefused: func(r Refusal) { refused <- r },
	}
	var member atomic.Bool // the backend's address is a cluster member's
	p.Blocked = func(a netip.Addr) bool { return member.Load() && a == dst.Addr() }
	rules := Rules{AllowDomains: []string{"allowed.test"}, DenyOut: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}
	served := make(chan struct{})
	go func() {
		p.Serve(l, func() Rules { return rules }, func(net.Conn) (netip.AddrPort, error) { return dst, nil })
		close(served)
	}()
	get := func(host, path string) (string, error) {
		c, err := net.Dial("tcp4", l.Addr().String())
		if err != nil {
			return "", err
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		return string(b), err
	}
	if out, err := get("allowed.test", "/"); err != nil || !strings.HasSuffix(out, "\r\n\r\nok") {
		t.Fatalf("allowed name: %q %v", out, err)
	}
	start := time.Now()
	if out, err := get("evil.test", "/"); err == nil && out != "" || time.Since(start) > time.Second {
		t.Fatalf("a name not allowed: %q %v after %v; want a reset at once", out, err, time.Since(start))
	}
	if r := <-refused; r.Domain != "evil.test" || r.Dst != dst {
		t.Fatalf("refusal %+v", r)
	}
	// An allowed name that resolves to a blocked address (a cluster
	// member, say) is refused all the same, from the next connection on.
	member.Store(true)
	if out, err := get("allowed.test", "/"); err == nil && out != "" {
		t.Fatalf("an allowed name resolving to a blocked address: %q; want a reset", out)
	}
	if r := <-refused; r.Domain != "allowed.test" || !strings.Contains(r.Reason, "no sandbox may reach") {
		t.Fatalf("refusal %+v", r)
	}
	member.Store(false)

	idle, err := net.Dial("tcp4", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /idle HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
	time.Sleep(200 * time.Millisecond) // relaying now
	l.Close()
	select {
	case <-served:
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return with an idle relay open: a slot's release would hang")
	}
}
