package interpreter

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/envd"
)

// startEnvd serves a real envd with token (none if empty) whose /init
// anyone may call, as the node does after a restore.
func startEnvd(t *testing.T, token string) *httptest.Server {
	t.Helper()
	e, err := envd.New(envd.Options{AccessToken: token, Logger: slog.New(slog.DiscardHandler),
		InitFrom: func(netip.Addr) bool { return true }})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(e.Handler())
	t.Cleanup(func() { ts.Close(); e.Close() })
	return ts
}

// newAuthServer is the service over envdURL, without its Python kernel:
// these tests run bash, which needs nothing installed.
func newAuthServer(t *testing.T, envdURL string) *httptest.Server {
	t.Helper()
	s := New(Config{Cwd: t.TempDir(), EnvdURL: envdURL, Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() { ts.Close(); s.Close() })
	return ts
}

// send makes one request with token (none if empty) and returns the
// status and the body.
func send(t *testing.T, method, url, token string, body any) (int, string) {
	t.Helper()
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	req, err := http.NewRequest(method, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set(AccessTokenHeader, token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(res.Body)
	return res.StatusCode, out.String()
}

var echo = map[string]any{"code": "echo ran", "language": "bash"}

// refused checks a 401 with its JSON error.
func refused(t *testing.T, what string, status int, body string) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if status != http.StatusUnauthorized || json.Unmarshal([]byte(body), &e) != nil || e.Code != 401 || e.Message == "" {
		t.Fatalf("%s: %d %s, want 401 with {code, message}", what, status, body)
	}
	if strings.Contains(body, "ran\\n") {
		t.Fatalf("%s: refused, yet the code ran: %s", what, body)
	}
}

func ran(t *testing.T, what string, status int, body string) {
	t.Helper()
	if status != http.StatusOK || !strings.Contains(body, `"text":"ran\n"`) {
		t.Fatalf("%s: %d %s, want the code's output", what, status, body)
	}
}

func TestAccessToken(t *testing.T) {
	e := startEnvd(t, "token-a")
	ts := newAuthServer(t, e.URL)

	status, body := send(t, "POST", ts.URL+"/execute", "", echo)
	refused(t, "no token", status, body)
	status, body = send(t, "POST", ts.URL+"/execute", "token-b", echo)
	refused(t, "another sandbox's token", status, body)
	status, body = send(t, "POST", ts.URL+"/execute", "token-a", echo)
	ran(t, "the sandbox's token", status, body)

	if status, body := send(t, "GET", ts.URL+"/health", "", nil); status != http.StatusOK {
		t.Fatalf("health without a token: %d %s", status, body)
	}
	// The SDK's context calls carry no token: they work without one,
	// but not with a wrong one.
	if status, body := send(t, "GET", ts.URL+"/contexts", "", nil); status != http.StatusOK {
		t.Fatalf("list contexts without a token: %d %s", status, body)
	}
	status, body = send(t, "POST", ts.URL+"/contexts", "token-b", map[string]any{"language": "bash"})
	refused(t, "create a context with another sandbox's token", status, body)

	// A restore hands the sandbox a new token through envd's /init: the
	// service honours it at once, and the old one no more.
	status, body = send(t, "POST", e.URL+"/init", "token-a", map[string]any{"accessToken": "token-c"})
	if status != http.StatusNoContent {
		t.Fatalf("init: %d %s", status, body)
	}
	status, body = send(t, "POST", ts.URL+"/execute", "token-a", echo)
	refused(t, "the token before /init", status, body)
	status, body = send(t, "POST", ts.URL+"/execute", "token-c", echo)
	ran(t, "the token /init set", status, body)
}

func TestAccessTokenInsecureSandbox(t *testing.T) {
	ts := newAuthServer(t, startEnvd(t, "").URL)
	status, body := send(t, "POST", ts.URL+"/execute", "", echo)
	ran(t, "no token in a sandbox without one", status, body)
}

func TestAccessTokenEnvdDown(t *testing.T) {
	e := startEnvd(t, "token-a")
	ts := newAuthServer(t, e.URL)
	e.Close()
	status, body := send(t, "POST", ts.URL+"/execute", "token-a", echo)
	if status != http.StatusServiceUnavailable || strings.Contains(body, `"text":"ran`) {
		t.Fatalf("envd down: %d %s, want 503 and nothing run", status, body)
	}
}
