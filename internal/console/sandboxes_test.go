package console

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestSandboxRoutesRefuse: the console's sandbox routes answer nothing
// without a session, refuse changes without the CSRF token or from
// another origin, and a terminal without its token or from another
// origin, all before anything is asked of the API behind.
func TestSandboxRoutesRefuse(t *testing.T) {
	f := newFixture(t)
	ck, csrf := f.signIn(t, f.key)
	const sb = "/console/api/sandboxes/abc123"
	for _, c := range []struct {
		name, method, target string
		session              bool
		origin, csrf         string
		want                 int
	}{
		{"listing without a session", "GET", sb + "/files", false, "", "", http.StatusUnauthorized},
		{"download without a session", "GET", sb + "/files/content?path=/etc/hostname", false, "", "", http.StatusUnauthorized},
		{"terminal without a session", "GET", sb + "/terminal?csrf=" + csrf, false, "", "", http.StatusUnauthorized},
		{"upload without the CSRF token", "POST", sb + "/files/content?path=/tmp/x", true, "", "", http.StatusForbidden},
		{"upload with a wrong CSRF token", "POST", sb + "/files/content?path=/tmp/x", true, "", "nope", http.StatusForbidden},
		{"upload from another origin", "POST", sb + "/files/content?path=/tmp/x", true, "http://evil.test", csrf, http.StatusForbidden},
		{"terminal without its token", "GET", sb + "/terminal", true, "", "", http.StatusForbidden},
		{"terminal with a wrong token", "GET", sb + "/terminal?csrf=nope", true, "", "", http.StatusForbidden},
		{"terminal from another origin", "GET", sb + "/terminal?csrf=" + csrf, true, "http://evil.test", "", http.StatusForbidden},
		{"a bad sandbox id", "GET", "/console/api/sandboxes/NOT_AN_ID/files", true, "", "", http.StatusBadRequest},
		{"an unknown route", "GET", sb + "/nope", true, "", "", http.StatusNotFound},
		{"a listing's wrong method", "DELETE", sb + "/files", true, "", csrf, http.StatusMethodNotAllowed},
		{"a terminal's wrong method", "POST", sb + "/terminal", true, "", csrf, http.StatusMethodNotAllowed},
	} {
		r := httptest.NewRequest(c.method, c.target, strings.NewReader("data"))
		if c.session {
			r.AddCookie(ck)
		}
		if c.origin != "" {
			r.Header.Set("Origin", c.origin)
		}
		if c.csrf != "" {
			r.Header.Set(CSRFHeader, c.csrf)
		}
		res := f.do(r)
		if res.StatusCode != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, res.StatusCode, body(res), c.want)
		}
		if res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s: answered %q, want a JSON error", c.name, res.Header.Get("Content-Type"))
		}
		if f.next.called {
			t.Errorf("%s: the API behind was called", c.name)
		}
	}
}

// TestSandboxRoutesAsTheSessionsKey: a route reads the sandbox from the
// API as the session's key, and what the API answers (a 404 for a
// sandbox the key may not see) is what the browser gets.
func TestSandboxRoutesAsTheSessionsKey(t *testing.T) {
	f := newFixture(t)
	ck, _ := f.signIn(t, f.key)
	r := httptest.NewRequest("GET", "/console/api/sandboxes/abc123/files?path=/", nil)
	r.AddCookie(ck)
	res := f.do(r)
	// The recorder answers 418 to everything: passed through as it is.
	if res.StatusCode != http.StatusTeapot {
		t.Fatalf("listing: %d %s, want the API's answer (418)", res.StatusCode, body(res))
	}
	if f.next.key == nil || f.next.key.ID != f.keyInfo.ID {
		t.Fatalf("the API was asked as %v, want the session's key %s", f.next.key, f.keyInfo.ID)
	}
	if f.next.cookie != "" {
		t.Errorf("the API saw the cookie %q", f.next.cookie)
	}
}

// TestHandlerTransport: responses stream as the handler writes them,
// closing the body ends the handler's request, and a handler's panic
// ends its response, not the process.
func TestHandlerTransport(t *testing.T) {
	proceed := make(chan struct{})
	ended := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			w.Header().Set("X-Test", "1")
			w.WriteHeader(http.StatusAccepted)
			_, _ = io.WriteString(w, "first")
			<-proceed
			_, _ = io.WriteString(w, "second")
			<-r.Context().Done()
			ended <- r.Context().Err()
		case "/panic":
			panic(http.ErrAbortHandler)
		case "/echo":
			b, _ := io.ReadAll(r.Body)
			_, _ = w.Write(b)
		}
	})
	var panics []any
	hc := &http.Client{Transport: handlerTransport{h: h, onPanic: func(v any) { panics = append(panics, v) }}}
	res, err := hc.Get("http://console.test/stream")
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusAccepted || res.Header.Get("X-Test") != "1" {
		t.Fatalf("got %d %v, want 202 with the handler's header", res.StatusCode, res.Header)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(res.Body, buf[:5]); err != nil || string(buf[:5]) != "first" {
		t.Fatalf("first write: %q %v", buf[:5], err)
	}
	close(proceed)
	if _, err := io.ReadFull(res.Body, buf[:6]); err != nil || string(buf[:6]) != "second" {
		t.Fatalf("second write: %q %v", buf[:6], err)
	}
	res.Body.Close()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the handler's request ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("closing the body did not end the handler's request")
	}

	res, err = hc.Post("http://console.test/echo", "text/plain", strings.NewReader("round trip"))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(res.Body); string(b) != "round trip" {
		t.Fatalf("echo: %q", b)
	}

	res, err = hc.Get("http://console.test/panic")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(res.Body); err == nil {
		t.Fatal("a panicked handler's body read to its end without an error")
	}
	if len(panics) != 0 {
		t.Fatalf("http.ErrAbortHandler was reported: %v", panics)
	}
}
