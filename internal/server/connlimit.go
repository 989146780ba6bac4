package server

import (
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Default connection limits of the API listener.
const (
	DefaultMaxConnections          = 20000
	DefaultMaxConnectionsPerClient = 1000
)

// limitListener bounds the connections a listener holds open, in all and
// per client address, so that no client can use up the server's file
// descriptors or crowd the others out. A connection past a limit is
// closed at once rather than queued: a client that is refused learns it
// immediately, and one that holds connections open gets nothing more.
// Hand-written because x/net/netutil's LimitListener queues (it stops
// accepting), which leaves every client waiting behind the one at fault,
// and knows nothing of addresses.
type limitListener struct {
	net.Listener
	max, perClient int
	// exempt are addresses no per-client limit applies to (proxies in
	// front of the server carry many clients).
	exempt []netip.Prefix
	log    *slog.Logger

	mu       sync.Mutex
	total    int
	byClient map[netip.Addr]int
	// lastLog rate-limits the refusal log line.
	lastLog time.Time
}

func newLimitListener(l net.Listener, max, perClient int, exempt []netip.Prefix, log *slog.Logger) net.Listener {
	if max <= 0 && perClient <= 0 {
		return l
	}
	return &limitListener{Listener: l, max: max, perClient: perClient, exempt: exempt, log: log, byClient: map[netip.Addr]int{}}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := clientAddrOf(c)
		l.mu.Lock()
		over := ""
		switch {
		case l.max > 0 && l.total >= l.max:
			over = "the server's"
		case l.perClient > 0 && l.byClient[addr] >= l.perClient && !l.isExempt(addr):
			over = "this client's"
		}
		if over != "" {
			logNow := time.Since(l.lastLog) > 10*time.Second
			if logNow {
				l.lastLog = time.Now()
			}
			l.mu.Unlock()
			c.Close()
			if logNow {
				l.log.Warn("refused a connection: "+over+" connection limit is reached", "remote", addr,
					"limit_total", l.max, "limit_per_client", l.perClient)
			}
			continue
		}
		l.total++
		l.byClient[addr]++
		l.mu.Unlock()
		return &limitedConn{Conn: c, release: func() { l.release(addr) }}, nil
	}
}

func (l *limitListener) isExempt(a netip.Addr) bool {
	for _, p := range l.exempt {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (l *limitListener) release(addr netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byClient[addr]--; l.byClient[addr] <= 0 {
		delete(l.byClient, addr)
	}
}

func clientAddrOf(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// limitedConn gives its slot back when closed (once, however often).
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}
