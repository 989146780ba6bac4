package server

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
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
