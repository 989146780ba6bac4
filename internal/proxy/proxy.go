// Package proxy carries client traffic to ports inside sandboxes: envd's
// (49983) for the SDKs and any port a user's program listens on. A request
// names its sandbox and port either by Host (`<port>-<id>.<domain>`) or by
// the E2B headers `E2b-Sandbox-Id` / `E2b-Sandbox-Port`. The server package
// mounts it in front of the API.
package proxy

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"path"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/ids"
)

// Headers the E2B SDKs send when E2B_SANDBOX_URL points at one base URL.
const (
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
)

// DefaultPort is envd's port, used when a request names no port.
const DefaultPort = 49983

var hostPattern = regexp.MustCompile(`^([0-9]{1,5})-([a-z0-9]+)\.`)

// ErrUnavailable is the class of a Resolver's error for a sandbox that
// cannot be reached for now (its node cannot be, or the state that says
// where it runs): answered 503 with the reason, which the client may
// retry, not as a sandbox that is not running.
var ErrUnavailable = errors.New("unavailable for now")

// Resolver finds where a sandbox is reachable from this host. The proxy
// asks it on every request, with the request's context: an id it does not
// hold in memory may cost it a read of the state store, which must end
// when the client goes.
type Resolver interface {
	SandboxRoute(ctx context.Context, id string) (Route, error)
}

// Route is how a sandbox's ports are reached.
type Route struct {
	// Addr is the sandbox's address on its node.
	Addr netip.Addr
	// Via, when set, is the node agent (host:port) that runs the sandbox:
	// requests go to it, naming the sandbox and port in the E2B headers
	// and carrying the cluster token, and its own proxy dials Addr.
	Via string
	// TrafficToken, when set, must come in HeaderTrafficToken with every
	// request to the sandbox's own ports (envd's has its own token).
	TrafficToken string
	// MaskRequestHost, when set, is the Host requests to the sandbox's own
	// ports arrive with (E2B's network.maskRequestHost; ${PORT} becomes
	// the port), so that a server inside sees the name it expects.
	MaskRequestHost string
}

// HeaderTrafficToken carries a sandbox's traffic access token (E2B's).
const HeaderTrafficToken = "E2b-Traffic-Access-Token"

// Proxy is an http.Handler for sandbox traffic. It is safe for concurrent
// use.
type Proxy struct {
	resolve Resolver
	log     *slog.Logger
	rp      *httputil.ReverseProxy
	// via, when set, reaches node agents (SetVia).
	via ViaDialer

	mu    sync.Mutex
	conns map[string]map[*trackedConn]struct{} // upstream connections by sandbox
	// ended holds why sandboxes that died on their own ended, for the
	// streams their death cut (see endStream).
	ended map[string]endReason

	// starts admits process starts to this host's sandboxes (startGate).
	starts *startGate
	// envdPort is the port starts are gated on: DefaultPort, but in tests.
	envdPort uint16
}

type endReason struct {
	why string
	at  time.Time
}

// endedFor is how long a dead sandbox's reason is kept for its streams.
const endedFor = time.Minute

// trackedConn is an upstream connection the proxy can cut when its sandbox
// goes away: a dead sandbox's network vanishes without a reset, and the
// client would otherwise wait for TCP to time out.
type trackedConn struct {
	net.Conn
	p    *Proxy
	id   string
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.p.mu.Lock()
		delete(c.p.conns[c.id], c)
		if len(c.p.conns[c.id]) == 0 {
			delete(c.p.conns, c.id)
		}
		c.p.mu.Unlock()
	})
	return c.Conn.Close()
}

// Forget closes every connection to sandbox id; call it when the sandbox
// is killed or dies. For a sandbox that died, reason says why: the Connect
// streams the death cuts end with an error that says it.
func (p *Proxy) Forget(id, reason string) {
	p.mu.Lock()
	conns := p.conns[id]
	delete(p.conns, id)
	now := time.Now()
	for k, e := range p.ended {
		if now.Sub(e.at) > endedFor {
			delete(p.ended, k)
		}
	}
	if reason != "" {
		p.ended[id] = endReason{why: reason, at: now}
	}
	p.mu.Unlock()
	for c := range conns {
		c.Conn.Close()
	}
	if len(conns) > 0 {
		p.log.Debug("closed connections to a gone sandbox", "sandbox_id", id, "count", len(conns))
	}
}

// idleConnTimeout is how long a connection to a sandbox (or a node that
// forwards to one) waits idle for its next request. An agent's commands
// come between its model's turns, often more than 30 s apart: a shorter
// wait closed the connection in each pause (a wake-up of the idle
// sandbox) and gave the next command a fresh one into the sandbox's
// network stack. envd closes its side after 5 minutes idle.
const idleConnTimeout = 2 * time.Minute

type target struct {
	id   string
	addr netip.AddrPort
	via  string
}

type targetKey struct{}

// New returns a proxy that reaches sandboxes through r. via are the
// headers requests routed through a node agent carry (its cluster
// token); clients' own values of them are dropped.
func New(r Resolver, via http.Header, log *slog.Logger) *Proxy {
	if log == nil {
		log = slog.Default()
	}
	p := &Proxy{resolve: r, log: log, conns: map[string]map[*trackedConn]struct{}{}, ended: map[string]endReason{},
		starts: newStartGate(startSlots(), startHoldMax), envdPort: DefaultPort}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			t := ctx.Value(targetKey{}).(target)
			d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}
			dest := t.addr.String()
			if t.via != "" {
				dest = t.via
			} else {
				// A sandbox is on this host, behind its veth, and Forget
				// closes its connections when it goes: keep-alive probes
				// would find nothing, and each woke an idle sandbox (~9
				// host CPU-ms under gVisor on the 2-core test host).
				d.KeepAlive = -1
			}
			var c net.Conn
			var err error
			if t.via != "" && p.via != nil {
				c, err = p.via.DialVia(ctx, t.via)
			} else {
				c, err = d.DialContext(ctx, "tcp", dest)
			}
			if err != nil {
				return nil, err
			}
			tc := &trackedConn{Conn: c, p: p, id: t.id}
			p.mu.Lock()
			if p.conns[t.id] == nil {
				p.conns[t.id] = map[*trackedConn]struct{}{}
			}
			p.conns[t.id][tc] = struct{}{}
			p.mu.Unlock()
			return tc, nil
		},
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     idleConnTimeout,
		// Sandboxes' bodies pass through untouched.
		DisableCompression: true,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			t := pr.In.Context().Value(targetKey{}).(target)
			pr.Out.URL.Scheme = "http"
			// The transport pools connections by URL host. Keying them by
			// sandbox id (not address) keeps a connection to a killed
			// sandbox from serving the next sandbox that gets its address;
			// the dialer resolves the real address from the context.
			pr.Out.URL.Host = net.JoinHostPort(t.id, strconv.Itoa(int(t.addr.Port())))
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Del(HeaderSandboxID)
			pr.Out.Header.Del(HeaderSandboxPort)
			for k := range via {
				pr.Out.Header.Del(k)
			}
			if t.via != "" {
				pr.Out.Header.Set(HeaderSandboxID, t.id)
				pr.Out.Header.Set(HeaderSandboxPort, strconv.Itoa(int(t.addr.Port())))
				hdr := via
				if p.via != nil {
					hdr = p.via.ViaHeader(t.via)
				}
				for k, vs := range hdr {
					pr.Out.Header[k] = vs
				}
			}
			pr.SetXForwarded()
		},
		Transport: transport,
		ModifyResponse: func(resp *http.Response) error {
			if release, ok := resp.Request.Context().Value(startKey{}).(func()); ok {
				release() // envd answered: the process has started
			}
			if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/connect+") {
				t := resp.Request.Context().Value(targetKey{}).(target)
				resp.Body = &connectStream{body: resp.Body, p: p, id: t.id}
			}
			return nil
		},
		// Stream every write at once: envd's server streams carry process
		// output that the client must see before the process ends.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t := r.Context().Value(targetKey{}).(target)
			p.log.Debug("proxying to sandbox", "sandbox_id", t.id, "port", t.addr.Port(), "err", err)
			writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s is not reachable on port %d", t.id, t.addr.Port()))
		},
	}
	return p
}

// Match reports whether r is addressed to a sandbox rather than the API,
// and which sandbox and port.
func Match(r *http.Request) (id string, port int, ok bool) {
	if id := r.Header.Get(HeaderSandboxID); id != "" {
		port := DefaultPort
		if ps := r.Header.Get(HeaderSandboxPort); ps != "" {
			p, err := strconv.Atoi(ps)
			if err != nil {
				p = -1
			}
			port = p
		}
		return id, port, true
	}
	if m := hostPattern.FindStringSubmatch(r.Host); m != nil {
		p, _ := strconv.Atoi(m[1])
		return m[2], p, true
	}
	return "", 0, false
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, port, ok := Match(r)
	if !ok {
		writeError(w, http.StatusBadRequest, "request names no sandbox")
		return
	}
	if !ids.Valid(id) {
		// Refused before any lookup, so that junk costs nothing: a
		// client's error (no sandbox can have such an id), never a 5xx.
		// The id is not echoed, as it may be 64 KiB.
		writeError(w, http.StatusBadRequest, "invalid sandbox id: ids match ^[a-z0-9]{1,64}$")
		return
	}
	if port < 1 || port > 65535 {
		writeError(w, http.StatusBadRequest, "invalid sandbox port")
		return
	}
	if port == DefaultPort && path.Clean("/"+r.URL.Path) == "/init" {
		// envd takes its configuration (token, default user, environment)
		// from its node only; forwarded, it would let anyone who knows a
		// sandbox id take the sandbox over.
		writeError(w, http.StatusForbidden, "envd's /init is not reachable through the proxy")
		return
	}
	route, err := p.resolve.SandboxRoute(r.Context(), id)
	if errors.Is(err, ErrUnavailable) {
		w.Header().Set("Retry-After", "2")
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	if err != nil {
		// The SDKs read a 502 on envd's /health as "sandbox not running".
		writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s not found", id))
		return
	}
	if route.TrafficToken != "" && port != DefaultPort {
		got := r.Header.Get(HeaderTrafficToken)
		if subtle.ConstantTimeCompare([]byte(got), []byte(route.TrafficToken)) != 1 {
			writeError(w, http.StatusForbidden, fmt.Sprintf("sandbox %s's ports are private: send its traffic access token in %s", id, HeaderTrafficToken))
			return
		}
		r.Header.Del(HeaderTrafficToken)
	}
	if route.MaskRequestHost != "" && port != DefaultPort {
		r.Host = strings.ReplaceAll(route.MaskRequestHost, "${PORT}", strconv.Itoa(port))
	}
	t := target{id: id, addr: netip.AddrPortFrom(route.Addr, uint16(port)), via: route.Via}
	// Go's HTTP/1 server stops reading a request body once the handler
	// has flushed response headers, which would cut envd's streams while
	// the request body is still being copied upstream. Full duplex keeps
	// both directions open, as a proxy needs.
	_ = http.NewResponseController(w).EnableFullDuplex()
	ctx := context.WithValue(r.Context(), targetKey{}, t)
	if t.via == "" && t.addr.Port() == p.envdPort && r.Method == http.MethodPost && r.URL.Path == processStartPath {
		release, err := p.starts.enter(ctx)
		if err != nil {
			return // the client went while it waited
		}
		defer release()
		ctx = context.WithValue(ctx, startKey{}, release)
	}
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": code, "message": msg})
}

// connectStream passes a Connect streaming response through, following
// its envelopes, so that a stream cut by its sandbox's death between two
// messages ends with a Connect end-of-stream error saying why ("killed:
// out of memory") instead of a truncated body the client can only call a
// protocol error.
type connectStream struct {
	body io.ReadCloser
	p    *Proxy
	id   string
	// left is what remains of the message being passed; 0 at a
	// boundary. hdr collects an envelope header split across reads.
	left int
	hdr  []byte
	tail *bytes.Reader
	// inEnd is set while the envelope passed is the end of the stream;
	// ended once it has passed whole.
	inEnd, ended bool
}

// drainWait bounds the wait for the body's end after Connect's end of
// stream (the chunked encoding's last chunk, which follows at once).
const drainWait = 100 * time.Millisecond

func (c *connectStream) Read(b []byte) (int, error) {
	if c.tail != nil {
		return c.tail.Read(b)
	}
	n, err := c.body.Read(b)
	c.follow(b[:n])
	if err == nil && c.ended {
		// The stream is over: read the body's end before the client has
		// the last message. A client stops reading there and closes its
		// connection, which cancels this request; the connection to the
		// sandbox (or its node: a TLS handshake) would then be dropped
		// rather than kept for the next stream.
		//
		// The stream is whole whether or not that end comes in time: a
		// drain cut short costs only the connection's reuse. Reading on
		// would fail on the closed body and abort the client's response
		// after its last message (a loaded host delayed envd's last chunk
		// past drainWait, and the SDK's command failed "terminated").
		timer := time.AfterFunc(drainWait, func() { c.body.Close() })
		io.Copy(io.Discard, io.LimitReader(c.body, 4<<10))
		timer.Stop()
		c.tail = bytes.NewReader(nil)
		return n, io.EOF
	}
	if err == nil || err == io.EOF {
		return n, err
	}
	c.p.mu.Lock()
	e, ok := c.p.ended[c.id]
	c.p.mu.Unlock()
	if !ok || c.left != 0 || len(c.hdr) != 0 {
		return n, err
	}
	c.tail = bytes.NewReader(endStream(fmt.Sprintf("sandbox %s ended: %s", c.id, e.why)))
	return n, nil
}

// follow advances over the envelopes in b: a flags byte and a 4-byte
// big-endian length, then that many bytes.
func (c *connectStream) follow(b []byte) {
	for len(b) > 0 {
		if c.left > 0 {
			k := min(c.left, len(b))
			c.left -= k
			b = b[k:]
			c.ended = c.inEnd && c.left == 0
			continue
		}
		need := 5 - len(c.hdr)
		k := min(need, len(b))
		c.hdr = append(c.hdr, b[:k]...)
		b = b[k:]
		if len(c.hdr) == 5 {
			c.left = int(binary.BigEndian.Uint32(c.hdr[1:5]))
			c.inEnd = c.hdr[0]&0x02 != 0
			c.ended = c.inEnd && c.left == 0
			c.hdr = c.hdr[:0]
		}
	}
}

func (c *connectStream) Close() error { return c.body.Close() }

// endStream is a Connect end-of-stream envelope carrying an unavailable
// error with msg.
func endStream(msg string) []byte {
	payload, _ := json.Marshal(map[string]any{"error": map[string]string{"code": "unavailable", "message": msg}})
	out := make([]byte, 5, 5+len(payload))
	out[0] = 0x02 // end of stream
	binary.BigEndian.PutUint32(out[1:], uint32(len(payload)))
	return append(out, payload...)
}
