package console_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/console"
	"github.com/aenvhq/aenv/internal/server"
	"github.com/aenvhq/aenv/internal/testutil"
)

// startServer runs a real API server with a local node (gVisor, netns,
// envd), the console in front of it as Start wires it.
func startServer(t *testing.T) (base string, admin *client.Client) {
	t.Helper()
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	rootfs := os.Getenv("AENV_BASE_ROOTFS")
	if rootfs == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS not set (make base builds it)")
	}
	binDir := os.Getenv("AENV_BIN_DIR")
	if binDir == "" {
		testutil.Unavailable(t, "AENV_BIN_DIR not set (make build puts envd there)")
	}
	dir := t.TempDir()
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	srv, err := server.Start(context.Background(), server.Config{Config: agent.Config{
		Listen:         "127.0.0.1:0",
		DataDir:        filepath.Join(dir, "data"),
		RunDir:         filepath.Join(dir, "run"),
		RunscPath:      runsc,
		EnvdPath:       filepath.Join(binDir, "envd"),
		BaseRootFS:     rootfs,
		SandboxCIDR:    "10.241.0.0/16",
		NetnsTag:       "cnslt",
		NetnsPoolSize:  2,
		WarmPoolFloor:  1,
		WarmPoolMemory: 256 << 20,
		OnStop:         cluster.StopKill,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}})
	if err != nil {
		t.Fatalf("starting server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("closing server: %v", err)
		}
	})
	base = "http://" + srv.Addr().String()
	return base, client.New(base, srv.APIKey())
}

// browser is a browser signed in to the console: its cookies and CSRF
// token.
type browser struct {
	t    *testing.T
	base string
	http *http.Client
	csrf string
}

func signIn(t *testing.T, base, key string) *browser {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	b := &browser{t: t, base: base, http: &http.Client{Jar: jar}}
	res, err := b.http.Post(base+"/console/session", "application/json", strings.NewReader(`{"apiKey":"`+key+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var s struct{ CSRFToken string }
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil || res.StatusCode != http.StatusOK || s.CSRFToken == "" {
		t.Fatalf("signing in: %d %v", res.StatusCode, err)
	}
	b.csrf = s.CSRFToken
	return b
}

// cookie is the browser's Cookie header for the server.
func (b *browser) cookie() string {
	u, _ := url.Parse(b.base)
	var parts []string
	for _, c := range b.http.Jar.Cookies(u) {
		parts = append(parts, c.Name+"="+c.Value)
	}
	return strings.Join(parts, "; ")
}

// do sends a request as the browser would from the console's page, with
// the CSRF token if csrf.
func (b *browser) do(method, path string, body io.Reader, csrf bool) (*http.Response, []byte) {
	b.t.Helper()
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Origin", b.base)
	if csrf {
		req.Header.Set(console.CSRFHeader, b.csrf)
	}
	res, err := b.http.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	return res, out
}

// dialTerminal opens a sandbox's terminal as the page does: the session
// cookie, the page's Origin and the CSRF token in the query.
func dialTerminal(ctx context.Context, base, id, cookie, origin, csrf string) (*websocket.Conn, *http.Response, error) {
	q := url.Values{"cols": {"100"}, "rows": {"30"}}
	if csrf != "" {
		q.Set("csrf", csrf)
	}
	h := http.Header{}
	if cookie != "" {
		h.Set("Cookie", cookie)
	}
	if origin != "" {
		h.Set("Origin", origin)
	}
	return websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/console/api/sandboxes/"+id+"/terminal?"+q.Encode(),
		&websocket.DialOptions{HTTPHeader: h})
}

// screen reads a terminal's output until it holds want (true), or the
// socket ends or ctx does (false, with what was read).
type screen struct {
	conn *websocket.Conn
	buf  bytes.Buffer
	// exit is the shell's exit message, once it came.
	exit *struct {
		Type string
		Code int
	}
}

func (s *screen) waitFor(ctx context.Context, want string) bool {
	for !strings.Contains(s.buf.String(), want) {
		if !s.readMore(ctx) {
			return false
		}
	}
	return true
}

// readMore reads one message: false once the socket has ended.
func (s *screen) readMore(ctx context.Context) bool {
	typ, data, err := s.conn.Read(ctx)
	if err != nil {
		return false
	}
	if typ == websocket.MessageBinary {
		s.buf.Write(data)
	} else {
		_ = json.Unmarshal(data, &s.exit)
	}
	return true
}

func (s *screen) send(ctx context.Context, t *testing.T, keys string) {
	t.Helper()
	if err := s.conn.Write(ctx, websocket.MessageBinary, []byte(keys)); err != nil {
		t.Fatalf("typing %q: %v", keys, err)
	}
}

// TestSandboxTerminalAndFiles drives the console's sandbox routes against
// a real sandbox: a terminal on a PTY (input, output, resize, the shell
// ended when the page goes), the file browser's list, upload and
// download, and what is refused: no session, another origin, no CSRF
// token, and another team's key.
func TestSandboxTerminalAndFiles(t *testing.T) {
	base, admin := startServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	alphaKey, err := admin.CreateKey(ctx, "alpha", client.KeyOptions{Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	betaKey, err := admin.CreateKey(ctx, "beta", client.KeyOptions{Team: "beta"})
	if err != nil {
		t.Fatal(err)
	}
	alpha := client.New(base, alphaKey.Key)
	sb, err := alpha.Create(ctx, client.CreateOptions{Timeout: 180})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.SandboxID
	a := signIn(t, base, alphaKey.Key)
	b := signIn(t, base, betaKey.Key)

	t.Run("terminal", func(t *testing.T) {
		conn, res, err := dialTerminal(ctx, base, id, a.cookie(), base, a.csrf)
		if err != nil {
			t.Fatalf("opening the terminal: %v (%v)", err, res)
		}
		defer conn.CloseNow()
		s := &screen{conn: conn}
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		defer rcancel()
		s.send(rctx, t, "echo hi-$((6*7))\r")
		if !s.waitFor(rctx, "hi-42") {
			t.Fatalf("no hi-42 on the terminal; it shows %q", s.buf.String())
		}
		s.send(rctx, t, "stty size\r")
		if !s.waitFor(rctx, "30 100") {
			t.Fatalf("stty size does not answer the size the page opened with (30 100); the terminal shows %q", s.buf.String())
		}
		if err := conn.Write(rctx, websocket.MessageText, []byte(`{"type":"resize","cols":123,"rows":45}`)); err != nil {
			t.Fatal(err)
		}
		s.send(rctx, t, "stty size\r")
		if !s.waitFor(rctx, "45 123") {
			t.Fatalf("stty size does not answer the resize to 45 123; the terminal shows %q", s.buf.String())
		}
		s.send(rctx, t, "echo pid-$$-end\r")
		pidPattern := regexp.MustCompile(`pid-([0-9]+)-end`)
		for !pidPattern.MatchString(s.buf.String()) {
			if !s.readMore(rctx) {
				t.Fatalf("no pid on the terminal: %q", s.buf.String())
			}
		}
		pid, _ := strconv.Atoi(pidPattern.FindStringSubmatch(s.buf.String())[1])
		alive := func() bool {
			code, err := alpha.Run(ctx, id, fmt.Sprintf("kill -0 %d", pid), client.RunOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return code == 0
		}
		if !alive() {
			t.Fatalf("shell %d is not running while its terminal is open", pid)
		}
		// The page goes: the shell must end with it.
		conn.Close(websocket.StatusGoingAway, "page closed")
		deadline := time.Now().Add(15 * time.Second)
		for alive() {
			if time.Now().After(deadline) {
				t.Fatalf("shell %d still runs 15 s after its terminal closed", pid)
			}
			time.Sleep(200 * time.Millisecond)
		}
	})

	t.Run("terminal ends with the shell", func(t *testing.T) {
		conn, _, err := dialTerminal(ctx, base, id, a.cookie(), base, a.csrf)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseNow()
		s := &screen{conn: conn}
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		defer rcancel()
		s.send(rctx, t, "exit 7\r")
		for s.readMore(rctx) {
		}
		if s.exit == nil || s.exit.Type != "exit" || s.exit.Code != 7 {
			t.Fatalf("the socket ended with %+v, want an exit message with code 7", s.exit)
		}
		if rctx.Err() != nil {
			t.Fatal("the socket stayed open after the shell exited")
		}
	})

	t.Run("terminal refusals", func(t *testing.T) {
		for _, c := range []struct {
			name                 string
			cookie, origin, csrf string
			want                 int
		}{
			{"no session cookie", "", base, a.csrf, http.StatusUnauthorized},
			{"another origin", a.cookie(), "http://evil.test", a.csrf, http.StatusForbidden},
			{"no CSRF token", a.cookie(), base, "", http.StatusForbidden},
			{"another session's CSRF token", a.cookie(), base, b.csrf, http.StatusForbidden},
			{"another team's key", b.cookie(), base, b.csrf, http.StatusNotFound},
		} {
			conn, res, err := dialTerminal(ctx, base, id, c.cookie, c.origin, c.csrf)
			if err == nil {
				conn.CloseNow()
				t.Errorf("%s: the terminal opened", c.name)
				continue
			}
			if res == nil || res.StatusCode != c.want {
				t.Errorf("%s: %v (%v), want HTTP %d", c.name, err, res, c.want)
			}
		}
	})

	t.Run("files", func(t *testing.T) {
		data := make([]byte, 300<<10)
		rand.Read(data)
		for i := range 256 {
			data[i] = byte(i)
		}
		const dir = "/home/user/console-up"
		content := "/console/api/sandboxes/" + id + "/files/content?path="
		res, body := a.do("POST", content+url.QueryEscape(dir+"/data.bin"), bytes.NewReader(data), true)
		if res.StatusCode != http.StatusNoContent {
			t.Fatalf("upload: %d %s", res.StatusCode, body)
		}
		res, body = a.do("GET", content+url.QueryEscape(dir+"/data.bin"), nil, false)
		if res.StatusCode != http.StatusOK || !bytes.Equal(body, data) {
			t.Fatalf("download: %d, %d bytes (equal: %v), want 200 and the %d bytes uploaded", res.StatusCode, len(body), bytes.Equal(body, data), len(data))
		}
		if cd := res.Header.Get("Content-Disposition"); !strings.HasPrefix(cd, "attachment") || !strings.Contains(cd, "data.bin") {
			t.Errorf("download's Content-Disposition %q, want an attachment named data.bin", cd)
		}
		// The SDK's way in reads what the console wrote.
		rc, _, err := alpha.Download(ctx, id, dir+"/data.bin", client.FileOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(rc)
		rc.Close()
		if !bytes.Equal(got, data) {
			t.Fatalf("the SDK reads %d bytes from the console's upload, want the %d uploaded", len(got), len(data))
		}

		res, body = a.do("GET", "/console/api/sandboxes/"+id+"/files?path="+url.QueryEscape(dir), nil, false)
		var list struct {
			Path    string
			Entries []client.Entry
		}
		if res.StatusCode != http.StatusOK || json.Unmarshal(body, &list) != nil {
			t.Fatalf("listing %s: %d %s", dir, res.StatusCode, body)
		}
		if len(list.Entries) != 1 || list.Entries[0].Name != "data.bin" || list.Entries[0].Type != "file" ||
			list.Entries[0].Size != int64(len(data)) || list.Entries[0].Path != dir+"/data.bin" {
			t.Fatalf("listing %s: %s, want data.bin alone, a file of %d bytes", dir, body, len(data))
		}
		res, body = a.do("GET", "/console/api/sandboxes/"+id+"/files", nil, false)
		if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `"console-up"`) {
			t.Fatalf("listing the home directory: %d %s, want console-up in it", res.StatusCode, body)
		}

		// Refused: no CSRF token, another origin, another team.
		if res, body := a.do("POST", content+url.QueryEscape(dir+"/nocsrf"), strings.NewReader("x"), false); res.StatusCode != http.StatusForbidden {
			t.Errorf("upload without the CSRF token: %d %s, want 403", res.StatusCode, body)
		}
		req, _ := http.NewRequest("POST", base+content+url.QueryEscape(dir+"/evil"), strings.NewReader("x"))
		req.Header.Set("Origin", "http://evil.test")
		req.Header.Set(console.CSRFHeader, a.csrf)
		if res, err := a.http.Do(req); err != nil || res.StatusCode != http.StatusForbidden {
			t.Errorf("upload from another origin: %v %v, want 403", res, err)
		}
		if res, body := b.do("GET", content+url.QueryEscape(dir+"/data.bin"), nil, false); res.StatusCode != http.StatusNotFound || bytes.Contains(body, data[:64]) {
			t.Errorf("another team's download: %d, want 404", res.StatusCode)
		}
		if res, body := b.do("POST", content+url.QueryEscape(dir+"/beta"), strings.NewReader("x"), true); res.StatusCode != http.StatusNotFound {
			t.Errorf("another team's upload: %d %s, want 404", res.StatusCode, body)
		}
		if res, body := b.do("GET", "/console/api/sandboxes/"+id+"/files?path=%2F", nil, false); res.StatusCode != http.StatusNotFound {
			t.Errorf("another team's listing: %d %s, want 404", res.StatusCode, body)
		}
		res, body = a.do("GET", "/console/api/sandboxes/"+id+"/files?path="+url.QueryEscape(dir), nil, false)
		if res.StatusCode != http.StatusOK || strings.Contains(string(body), "nocsrf") || strings.Contains(string(body), "evil") || strings.Contains(string(body), "beta") {
			t.Errorf("after the refused uploads %s holds %s, want data.bin alone", dir, body)
		}
		if res, body := a.do("GET", content+url.QueryEscape(dir+"/missing"), nil, false); res.StatusCode != http.StatusNotFound {
			t.Errorf("downloading a missing file: %d %s, want 404", res.StatusCode, body)
		}
	})
}
