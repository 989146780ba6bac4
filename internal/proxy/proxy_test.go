package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
)

func TestMatch(t *testing.T) {
	cases := []struct {
		host    string
		headers map[string]string
		id      string
		port    int
		ok      bool
	}{
		{host: "49983-abc123.localhost:8000", id: "abc123", port: 49983, ok: true},
		{host: "8080-abc.example.com", id: "abc", port: 8080, ok: true},
		{host: "localhost:8000"},
		{host: "api.example.com"},
		{host: "127.0.0.1:8000", headers: map[string]string{HeaderSandboxID: "abc", HeaderSandboxPort: "3000"}, id: "abc", port: 3000, ok: true},
		{host: "127.0.0.1:8000", headers: map[string]string{HeaderSandboxID: "abc"}, id: "abc", port: DefaultPort, ok: true},
		{host: "127.0.0.1:8000", headers: map[string]string{HeaderSandboxID: "abc", HeaderSandboxPort: "x"}, id: "abc", port: -1, ok: true},
	}
	for _, tc := range cases {
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = tc.host
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		id, port, ok := Match(r)
		if id != tc.id || port != tc.port || ok != tc.ok {
			t.Errorf("Match(%q, %v) = %q, %d, %v; want %q, %d, %v", tc.host, tc.headers, id, port, ok, tc.id, tc.port, tc.ok)
		}
	}
}

type resolver map[string]netip.Addr

func (r resolver) SandboxRoute(_ context.Context, id string) (Route, error) {
	a, ok := r[id]
	if !ok {
		return Route{}, errors.New("not found")
	}
	return Route{Addr: a}, nil
}

// TestServe proxies to a real listener standing in for a sandbox port and
// checks routing, header stripping, streaming and the error statuses.
func TestServe(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(HeaderSandboxID) != "" {
			http.Error(w, "routing header leaked", 500)
			return
		}
		if r.URL.Path == "/stream" {
			for i := range 3 {
				fmt.Fprintf(w, "chunk%d\n", i)
				w.(http.Flusher).Flush()
				time.Sleep(200 * time.Millisecond)
			}
			return
		}
		fmt.Fprintf(w, "host=%s path=%s", r.Host, r.URL.Path)
	}))
	defer backend.Close()
	_, portStr, _ := net.SplitHostPort(backend.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)

	p := New(resolver{"sb1": netip.MustParseAddr("127.0.0.1")}, nil, nil)
	front := httptest.NewServer(p)
	defer front.Close()

	get := func(host, path string, hdr map[string]string) (*http.Response, string) {
		req, _ := http.NewRequest("GET", front.URL+path, nil)
		req.Host = host
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}

	resp, body := get(fmt.Sprintf("%d-sb1.localhost", port), "/x", nil)
	if resp.StatusCode != 200 || !strings.Contains(body, "path=/x") {
		t.Fatalf("host routing: %d %q", resp.StatusCode, body)
	}
	resp, body = get("127.0.0.1", "/y", map[string]string{HeaderSandboxID: "sb1", HeaderSandboxPort: portStr})
	if resp.StatusCode != 200 || !strings.Contains(body, "path=/y") {
		t.Fatalf("header routing: %d %q", resp.StatusCode, body)
	}
	resp, _ = get("127.0.0.1", "/", map[string]string{HeaderSandboxID: "nope", HeaderSandboxPort: portStr})
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("unknown sandbox: %d, want 502", resp.StatusCode)
	}
	resp, _ = get("127.0.0.1", "/", map[string]string{HeaderSandboxID: "sb1", HeaderSandboxPort: "70000"})
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad port: %d, want 400", resp.StatusCode)
	}
	// An id of the wrong form is the client's error, refused before any
	// lookup.
	for _, id := range []string{"../x", strings.Repeat("a", 65), "ABC"} {
		resp, body := get("127.0.0.1", "/", map[string]string{HeaderSandboxID: id})
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"code":400`) || strings.Contains(body, id) {
			t.Fatalf("bad id %.10q: %d %s, want 400 without the id", id, resp.StatusCode, body)
		}
	}
	// envd's /init is never forwarded, however the path is spelled.
	for _, path := range []string{"/init", "//init", "/./init", "/x/../init"} {
		resp, _ = get("127.0.0.1", path, map[string]string{HeaderSandboxID: "sb1"})
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("%s through the proxy: %d, want 403", path, resp.StatusCode)
		}
	}
	// A port with nothing listening: 502, not a hang.
	resp, _ = get("1-sb1.localhost", "/", nil)
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("closed port: %d, want 502", resp.StatusCode)
	}

	// Streaming: the first chunk must arrive before the backend finishes.
	req, _ := http.NewRequest("GET", front.URL+"/stream", nil)
	req.Host = fmt.Sprintf("%d-sb1.localhost", port)
	start := time.Now()
	sresp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	buf := make([]byte, 7)
	if _, err := io.ReadFull(sresp.Body, buf); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); string(buf) != "chunk0\n" || el > 300*time.Millisecond {
		t.Fatalf("first chunk %q after %s: the proxy buffers streams", buf, el)
	}
}

type viaResolver struct{ via string }

func (r viaResolver) SandboxRoute(_ context.Context, id string) (Route, error) {
	return Route{Addr: netip.MustParseAddr("127.0.0.1"), Via: r.via}, nil
}

// TestServeVia: a sandbox on another node is reached through that node's
// proxy, which demands the cluster token; the token and the routing
// headers never reach the sandbox, and streams stay streams.
func TestServeVia(t *testing.T) {
	const token = "cluster-token-for-tests"
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(nodeapi.TokenHeader) != "" || r.Header.Get(HeaderSandboxID) != "" {
			http.Error(w, "token or routing header leaked", 500)
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "host=%s path=%s body=%s", r.Host, r.URL.Path, b)
	}))
	defer backend.Close()
	_, port, _ := net.SplitHostPort(backend.Listener.Addr().String())

	log := slog.New(slog.DiscardHandler)
	nodeSide := httptest.NewServer(nodeapi.RequireToken(token, log, New(resolver{"sb1": netip.MustParseAddr("127.0.0.1")}, nil, log)))
	defer nodeSide.Close()
	via := strings.TrimPrefix(nodeSide.URL, "http://")

	for _, tc := range []struct {
		token string
		want  int
	}{{token, 200}, {"wrong-token-wrong-token", http.StatusUnauthorized}} {
		front := httptest.NewServer(New(viaResolver{via}, http.Header{nodeapi.TokenHeader: {tc.token}}, log))
		req, _ := http.NewRequest("POST", front.URL+"/files", strings.NewReader("payload"))
		req.Host = port + "-sb1.localhost:8000"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		front.Close()
		if tc.want == 200 && (resp.StatusCode != 200 || !strings.Contains(string(b), "path=/files body=payload") ||
			!strings.Contains(string(b), "host="+port+"-sb1.localhost:8000")) {
			t.Fatalf("through the node: %d %q", resp.StatusCode, b)
		}
		if tc.want != 200 && resp.StatusCode != tc.want {
			t.Fatalf("a wrong cluster token: %d %q, want %d", resp.StatusCode, b, tc.want)
		}
	}
}

// TestStreamCutBySandboxDeath: a Connect stream that its sandbox's death
// cuts between two messages ends with an end-of-stream error saying why,
// after the messages that got through.
func TestStreamCutBySandboxDeath(t *testing.T) {
	msg := []byte(`{"event":{"data":{"stdout":"aGk="}}}`)
	env := append([]byte{0, 0, 0, 0, byte(len(msg))}, msg...)
	release := make(chan struct{})
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(env)
		w.(http.Flusher).Flush()
		<-release // the sandbox never answers again
	}))
	defer backend.Close()
	defer close(release)
	_, port, _ := net.SplitHostPort(backend.Listener.Addr().String())
	p := New(resolver{"sb1": netip.MustParseAddr("127.0.0.1")}, nil, nil)
	front := httptest.NewServer(p)
	defer front.Close()
	req, _ := http.NewRequest("POST", front.URL+"/process.Process/Start", nil)
	req.Host = port + "-sb1.localhost"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, len(env))
	if _, err := io.ReadFull(resp.Body, first); err != nil || !bytes.Equal(first, env) {
		t.Fatalf("first message: %q %v", first, err)
	}
	p.Forget("sb1", "killed: out of memory (memoryMB=256)")
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the rest: %v", err)
	}
	if len(rest) < 5 || rest[0] != 0x02 || !bytes.Contains(rest[5:], []byte(`"message":"sandbox sb1 ended: killed: out of memory (memoryMB=256)"`)) {
		t.Fatalf("after the sandbox died: %q, want an end-of-stream error saying why", rest)
	}
}

// unreachable is a Resolver whose sandbox runs on a node nobody reaches.
type unreachable struct{}

func (unreachable) SandboxRoute(context.Context, string) (Route, error) {
	return Route{}, fmt.Errorf("%w: node n2 is lost", ErrUnavailable)
}

// TestUnreachableNode: traffic for a sandbox whose node this server cannot
// reach is a 503 that names the node and why, with Retry-After, not the
// 502 of a sandbox that is not running.
func TestUnreachableNode(t *testing.T) {
	front := httptest.NewServer(New(unreachable{}, nil, nil))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/health", nil)
	req.Header.Set(HeaderSandboxID, "sb1")
	req.Header.Set(HeaderSandboxPort, "49983")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "node n2 is lost") || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a sandbox on an unreachable node: %d %s (Retry-After %q), want 503 naming the node", resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
}

// TestStreamsKeepTheirConnection: a client that stops reading at a
// Connect stream's end and closes its connection (as Connect's clients
// do) leaves the proxy's connection to the sandbox, or to the node that
// runs it, for the next stream: to a node, each new one would cost a TLS
// handshake.
func TestStreamsKeepTheirConnection(t *testing.T) {
	data := []byte(`{"event":{"data":{"stdout":"aGk="}}}`)
	end := []byte(`{}`)
	body := append(append([]byte{0, 0, 0, 0, byte(len(data))}, data...), append([]byte{2, 0, 0, 0, byte(len(end))}, end...)...)
	counted := func(h http.Handler) (*httptest.Server, *atomic.Int64) {
		var n atomic.Int64
		s := httptest.NewUnstartedServer(h)
		s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				n.Add(1)
			}
		}
		s.Start()
		return s, &n
	}
	backend, backendConns := counted(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(body)
		w.(http.Flusher).Flush()
		// The body's end comes after a while: a client has the whole
		// stream, and has gone, before it.
		time.Sleep(30 * time.Millisecond)
	}))
	defer backend.Close()
	_, port, _ := net.SplitHostPort(backend.Listener.Addr().String())
	const token = "cluster-token-for-tests"
	log := slog.New(slog.DiscardHandler)
	nodeSide, nodeConns := counted(nodeapi.RequireToken(token, log, New(resolver{"sb1": netip.MustParseAddr("127.0.0.1")}, nil, log)))
	defer nodeSide.Close()
	front := httptest.NewServer(New(viaResolver{strings.TrimPrefix(nodeSide.URL, "http://")}, http.Header{nodeapi.TokenHeader: {token}}, log))
	defer front.Close()
	for i := range 5 {
		// The request body as Connect's client sends it: streamed, of no
		// stated length, closed once the request message is written.
		pr, pw := io.Pipe()
		go func() { pw.Write([]byte{0, 0, 0, 0, 2, '{', '}'}); pw.Close() }()
		req, _ := http.NewRequest("POST", front.URL+"/process.Process/Start", pr)
		req.Host = port + "-sb1.localhost"
		req.Header.Set("Content-Type", "application/connect+json")
		// A fresh client each time: the front connection closes with the
		// body, before its end was read.
		c := &http.Client{Transport: &http.Transport{}}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(body))
		if _, err := io.ReadFull(resp.Body, got); err != nil || !bytes.Equal(got, body) {
			t.Fatalf("stream %d: %q %v", i, got, err)
		}
		resp.Body.Close()
		c.CloseIdleConnections()
	}
	if n, m := nodeConns.Load(), backendConns.Load(); n != 1 || m != 1 {
		t.Fatalf("5 streams took %d connections to the node and %d to the sandbox, want 1 each", n, m)
	}
}

// TestSlowBodyEndKeepsTheStream: a Connect stream whose end-of-stream
// message has passed is whole, however late the body's own end follows
// (a loaded host delays envd's last chunk): the client reads it to a
// clean end, not a cut connection.
func TestSlowBodyEndKeepsTheStream(t *testing.T) {
	data := []byte(`{"event":{"data":{"stdout":"aGk="}}}`)
	end := []byte(`{}`)
	body := append(append([]byte{0, 0, 0, 0, byte(len(data))}, data...), append([]byte{2, 0, 0, 0, byte(len(end))}, end...)...)
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		w.Write(body)
		w.(http.Flusher).Flush()
		time.Sleep(3 * drainWait)
	}))
	defer backend.Close()
	_, port, _ := net.SplitHostPort(backend.Listener.Addr().String())
	front := httptest.NewServer(New(resolver{"sb1": netip.MustParseAddr("127.0.0.1")}, nil, nil))
	defer front.Close()
	for i := range 2 {
		req, _ := http.NewRequest("POST", front.URL+"/process.Process/Start", nil)
		req.Host = port + "-sb1.localhost"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("stream %d: %q, %v; want the whole stream and a clean end", i, got, err)
		}
	}
}
