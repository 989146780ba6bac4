// Package egress enforces a sandbox's outbound rules by domain: its HTTP
// and TLS connections (ports 80 and 443) are redirected to a Proxy, which
// reads the name the sandbox asks for (the Host header, the TLS SNI),
// checks it against the rules, checks that the address the sandbox dialled
// is one that name resolves to (so an allowed name cannot carry traffic to
// another address), and then relays the connection or resets it at once.
// Everything else is decided by address, in nftables (package netns).
package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// Rules are a sandbox's outbound rules, E2B's network settings: an address
// in AllowOut, or a name matching AllowDomains, is reachable even when
// DenyOut covers it (allow wins over deny); without a match, DenyOut
// refuses and AllowInternet decides the rest.
type Rules struct {
	AllowInternet bool
	AllowOut      []netip.Prefix
	DenyOut       []netip.Prefix
	// AllowDomains are names ("example.com") and wildcards
	// ("*.example.com": its subdomains, not itself).
	AllowDomains []string
}

// validDomain is what a domain rule may look like.
var validDomain = regexp.MustCompile(`^(\*\.)?([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ParseDomain checks and normalises a domain rule.
func ParseDomain(s string) (string, error) {
	d := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
	if len(d) > 253 || !validDomain.MatchString(d) || d == "*" {
		return "", fmt.Errorf("%q is not a domain name (or *.domain)", s)
	}
	return d, nil
}

// AllowsDomain reports whether name matches a domain rule.
func (r Rules) AllowsDomain(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == "" {
		return false
	}
	for _, d := range r.AllowDomains {
		if suffix, ok := strings.CutPrefix(d, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return true
			}
		} else if name == d {
			return true
		}
	}
	return false
}

// AllowsAddr reports whether the address rules let a connection to a
// through.
func (r Rules) AllowsAddr(a netip.Addr) bool {
	for _, p := range r.AllowOut {
		if p.Contains(a) {
			return true
		}
	}
	for _, p := range r.DenyOut {
		if p.Contains(a) {
			return false
		}
	}
	return r.AllowInternet
}

// Refusal is a connection a Proxy refused.
type Refusal struct {
	Dst    netip.AddrPort
	Domain string
	Reason string
}

// Proxy relays the redirected connections its rules allow.
type Proxy struct {
	// Blocked reports addresses no sandbox may reach whatever its rules
	// (the host's networks, metadata, other sandboxes): the proxy dials
	// from the host, past the router's own blocks.
	Blocked func(netip.Addr) bool
	// Resolver resolves names to check where they point; it must use the
	// resolvers the sandboxes use. Nil: net.DefaultResolver.
	Resolver *net.Resolver
	// Lookup, when set, is used instead of Resolver (tests).
	Lookup func(ctx context.Context, name string) ([]netip.Addr, error)
	// OnRefused, if set, hears of every refusal.
	OnRefused func(Refusal)
	Logger    *slog.Logger
}

// MaxConnsPerSandbox bounds the connections one sandbox's proxy relays at
// once (each costs the node two descriptors).
const MaxConnsPerSandbox = 1024

// peekTimeout bounds how long a sandbox may take to say which name it
// wants.
const peekTimeout = 10 * time.Second

// maxPeek bounds what is read before deciding (an HTTP request's head, a
// TLS ClientHello).
const maxPeek = 32 << 10

// Serve accepts from l until it is closed, then closes the connections it
// still relays (their sandbox is going: its side would never end them) and
// returns once they are done. rules is read per connection, so that
// updated rules apply to new connections at once; origDst says where a
// connection was headed before its redirection.
func (p *Proxy) Serve(l net.Listener, rules func() Rules, origDst func(net.Conn) (netip.AddrPort, error)) {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		open = map[net.Conn]struct{}{}
	)
	defer func() {
		mu.Lock()
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	backoff := 5 * time.Millisecond
	for {
		c, err := l.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of descriptors, say: the listener stays, and the slot's
			// traffic is served again once there is room.
			p.log().Warn("egress: accepting a connection", "err", err)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		mu.Lock()
		if len(open) >= MaxConnsPerSandbox {
			mu.Unlock()
			p.log().Warn("egress: too many connections from one sandbox; refusing", "open", MaxConnsPerSandbox)
			reset(c)
			continue
		}
		open[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.handle(c, rules(), origDst)
			mu.Lock()
			delete(open, c)
			mu.Unlock()
		}()
	}
}

func (p *Proxy) log() *slog.Logger {
	if p.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return p.Logger
}

func (p *Proxy) handle(c net.Conn, rules Rules, origDst func(net.Conn) (netip.AddrPort, error)) {
	defer c.Close()
	dst, err := origDst(c)
	if err != nil {
		p.log().Warn("egress: the original destination of a redirected connection", "err", err)
		reset(c)
		return
	}
	c.SetReadDeadline(time.Now().Add(peekTimeout))
	var seen bytes.Buffer
	br := bufio.NewReaderSize(io.TeeReader(io.LimitReader(c, maxPeek), &seen), 4096)
	name := peekName(br, &seen)
	c.SetReadDeadline(time.Time{})
	if ok, why := p.decide(rules, name, dst.Addr()); !ok {
		r := Refusal{Dst: dst, Domain: name, Reason: why}
		p.log().Info("egress refused", "dst", dst, "domain", name, "reason", why)
		if p.OnRefused != nil {
			p.OnRefused(r)
		}
		reset(c)
		return
	}
	up, err := (&net.Dialer{Timeout: 10 * time.Second}).Dial("tcp", dst.String())
	if err != nil {
		reset(c)
		return
	}
	defer up.Close()
	if _, err := up.Write(seen.Bytes()); err != nil {
		return
	}
	relay(c, up)
}

// decide applies rules to a connection to a that asked for name ("" when
// it named none).
func (p *Proxy) decide(rules Rules, name string, a netip.Addr) (bool, string) {
	if p.Blocked != nil && p.Blocked(a) {
		return false, "the address is in a range no sandbox may reach"
	}
	if name != "" && rules.AllowsDomain(name) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		lookup := p.Lookup
		if lookup == nil {
			r := p.Resolver
			if r == nil {
				r = net.DefaultResolver
			}
			lookup = func(ctx context.Context, name string) ([]netip.Addr, error) { return r.LookupNetIP(ctx, "ip4", name) }
		}
		addrs, err := lookup(ctx, name)
		if err != nil {
			return false, fmt.Sprintf("%s is allowed but does not resolve: %v", name, err)
		}
		if slices.Contains(addrs, a.Unmap()) {
			return true, ""
		}
		if !rules.AllowsAddr(a) {
			return false, fmt.Sprintf("%s is allowed but does not resolve to %s", name, a)
		}
		return true, ""
	}
	if rules.AllowsAddr(a) {
		return true, ""
	}
	if name != "" {
		return false, fmt.Sprintf("%s matches no allowOut rule", name)
	}
	return false, "the address is not allowed and the connection named no domain"
}

// errStop ends a TLS handshake once the ClientHello is read.
var errStop = errors.New("stop")

// peekName reads the name a connection asks for: the SNI of a TLS
// ClientHello (parsed by crypto/tls itself), or an HTTP request's Host.
// What it reads stays in seen, to be replayed upstream.
func peekName(br *bufio.Reader, seen *bytes.Buffer) string {
	first, err := br.Peek(1)
	if err != nil {
		return ""
	}
	if first[0] == 0x16 { // a TLS handshake record
		var name string
		tls.Server(readOnly{br}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			name = h.ServerName
			return nil, errStop
		}}).Handshake()
		return name
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return ""
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return "" // an address, not a name
	}
	// The body (if any) is relayed as it comes; only the head was read.
	return host
}

// readOnly is a net.Conn over a reader that cannot be written: enough
// for crypto/tls to read a ClientHello.
type readOnly struct{ r io.Reader }

func (c readOnly) Read(b []byte) (int, error)         { return c.r.Read(b) }
func (c readOnly) Write(b []byte) (int, error)        { return 0, io.ErrClosedPipe }
func (c readOnly) Close() error                       { return nil }
func (c readOnly) LocalAddr() net.Addr                { return &net.TCPAddr{} }
func (c readOnly) RemoteAddr() net.Addr               { return &net.TCPAddr{} }
func (c readOnly) SetDeadline(t time.Time) error      { return nil }
func (c readOnly) SetReadDeadline(t time.Time) error  { return nil }
func (c readOnly) SetWriteDeadline(t time.Time) error { return nil }

// reset closes c with a TCP reset, so the sandbox's connect fails at once
// instead of timing out.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// relay copies both ways until both sides are done. A side that ends
// cleanly is half-closed (the other may still answer); one that fails (a
// reset, or Serve closing it) ends both.
func relay(a, b net.Conn) {
	errs := make(chan error, 2)
	cp := func(dst, src net.Conn) {
		_, err := io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok && err == nil {
			tc.CloseWrite()
		}
		errs <- err
	}
	go cp(a, b)
	go cp(b, a)
	if err := <-errs; err != nil {
		a.Close()
		b.Close()
	}
	<-errs
}
