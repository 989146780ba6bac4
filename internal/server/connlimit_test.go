package server

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"
)

// TestConnectionLimits: past the per-client limit a new connection is
// closed at once while the others stay open; a closed one gives its slot
// back; an exempt address is not bounded per client, only in all.
func TestConnectionLimits(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(raw, 5, 2, nil, slog.New(slog.DiscardHandler))
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	closedSoon := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return err == io.EOF
	}
	a, b := dial(), dial()
	third := dial()
	if !closedSoon(third) {
		t.Fatal("a third connection from one client was kept open past the limit of 2")
	}
	if closedSoon(a) || closedSoon(b) {
		t.Fatal("the connections within the limit were closed")
	}
	a.Close()
	time.Sleep(100 * time.Millisecond)
	again := dial()
	if closedSoon(again) {
		t.Fatal("a slot given back was not reusable")
	}
	b.Close()
	again.Close()

	ex := newLimitListener(raw, 3, 1, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}, slog.New(slog.DiscardHandler)).(*limitListener)
	if !ex.isExempt(netip.MustParseAddr("127.0.0.1")) || ex.isExempt(netip.MustParseAddr("10.0.0.1")) {
		t.Fatal("exemption by prefix")
	}
}

// TestConnectionLimitGlobal: once the server holds its limit of
// connections, from clients each within their own limit (and from an
// exempt proxy), a new one is closed at once while the open ones keep
// being served; a slot given back takes the next.
func TestConnectionLimitGlobal(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	exempt := []netip.Prefix{netip.MustParsePrefix("127.0.0.9/32")}
	l := newLimitListener(raw, 3, 2, exempt, slog.New(slog.DiscardHandler))
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	// 127.0.0.0/8 is all loopback on Linux: each source address is
	// another client.
	dialFrom := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// echoes reports whether c is served: what it sends comes back.
	echoes := func(c net.Conn) bool {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return false
		}
		buf := make([]byte, 4)
		_, err := io.ReadFull(c, buf)
		return err == nil && string(buf) == "ping"
	}
	// closedAtOnce reports whether the server closed c without a word.
	closedAtOnce := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return err == io.EOF || errors.Is(err, syscall.ECONNRESET)
	}
	open := []net.Conn{dialFrom("127.0.0.2"), dialFrom("127.0.0.3"), dialFrom("127.0.0.4")}
	for i, c := range open {
		if !echoes(c) {
			t.Fatalf("connection %d of 3, each from its own client, is not served under a limit of 3", i+1)
		}
	}
	for _, src := range []string{"127.0.0.5", "127.0.0.2", "127.0.0.9"} {
		if c := dialFrom(src); !closedAtOnce(c) {
			t.Fatalf("a connection from %s past the server's limit of 3 was kept open", src)
		}
	}
	for i, c := range open {
		if !echoes(c) {
			t.Fatalf("open connection %d stopped being served once the limit was reached", i+1)
		}
	}
	open[0].Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c := dialFrom("127.0.0.9")
		if echoes(c) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the slot of a closed connection was not given to the next")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
