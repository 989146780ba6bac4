package console

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// callerKey is how the test's next handler learns whom the console
// authenticated a request as.
type callerKey struct{}

func authenticate(r *http.Request, k apikeys.Key) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), callerKey{}, k))
}

// seen is what next was handed.
type seen struct {
	called bool
	key    *apikeys.Key
	cookie string
}

// recorder is a next handler that records the request it was handed.
func recorder(got *seen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.called = true
		got.cookie = r.Header.Get("Cookie")
		if k, ok := r.Context().Value(callerKey{}).(apikeys.Key); ok {
			got.key = &k
		} else {
			got.key = nil
		}
		w.WriteHeader(http.StatusTeapot)
	})
}

type fixture struct {
	keys     *apikeys.Keys
	dataKeys *sealed.Keyring
	console  *Console
	next     *seen
	handler  http.Handler
	key      string // a team key
	keyInfo  apikeys.Key
}

func newKeyring(t *testing.T, k sealed.Key) *sealed.Keyring {
	t.Helper()
	kr, err := sealed.NewKeyring([]sealed.Key{k}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func openKeys(t *testing.T, st state.Store) *apikeys.Keys {
	t.Helper()
	keys, err := apikeys.Open(context.Background(), st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(keys.Close)
	return keys
}

// newFixture is a console over a fresh key store, with one team key.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	keys := openKeys(t, state.NewMemory())
	key, info, err := keys.Create(context.Background(), apikeys.KeyOptions{Name: "alice", Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	return newFixtureOn(t, keys, newKeyring(t, sealed.NewKey()), key, info)
}

func newFixtureOn(t *testing.T, keys *apikeys.Keys, kr *sealed.Keyring, key string, info apikeys.Key) *fixture {
	f := &fixture{keys: keys, dataKeys: kr, next: &seen{}, key: key, keyInfo: info}
	f.console = New(Config{Keys: keys, DataKeys: kr, Authenticate: authenticate, Logger: slog.New(slog.DiscardHandler),
		IsSandboxTraffic: func(r *http.Request) bool { return r.Header.Get("E2b-Sandbox-Id") != "" }})
	f.handler = f.console.Wrap(recorder(f.next))
	return f
}

func (f *fixture) do(r *http.Request) *http.Response {
	w := httptest.NewRecorder()
	*f.next = seen{}
	f.handler.ServeHTTP(w, r)
	return w.Result()
}

// signIn signs in with key and returns the session cookie and CSRF token.
func (f *fixture) signIn(t *testing.T, key string) (*http.Cookie, string) {
	t.Helper()
	res := f.do(jsonRequest(http.MethodPost, "/console/session", `{"apiKey":"`+key+`"}`))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("sign-in with a good key: %d %s", res.StatusCode, body(res))
	}
	var s sessionJSON
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	ck := sessionCookie(t, res)
	return ck, s.CSRFToken
}

func jsonRequest(method, target, b string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(b))
	r.Header.Set("Content-Type", "application/json")
	return r
}

func body(res *http.Response) string {
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

func sessionCookie(t *testing.T, res *http.Response) *http.Cookie {
	t.Helper()
	for _, c := range res.Cookies() {
		if c.Name == cookieName || c.Name == tlsCookieName {
			return c
		}
	}
	t.Fatalf("no session cookie in %v", res.Header.Values("Set-Cookie"))
	return nil
}

// TestSignIn: a good key gets an HttpOnly, SameSite=Strict session cookie
// (Secure, with the __Host- prefix, over TLS) that holds neither the key
// nor anything readable; a bad or missing key gets 401 and no cookie.
// TestSignInLimited: LimitSignIn stands in front of the sign-in's key
// check, and of nothing else of the console's.
func TestSignInLimited(t *testing.T) {
	f := newFixture(t)
	limited := 0
	f.console = New(Config{Keys: f.keys, DataKeys: f.dataKeys, Authenticate: authenticate, Logger: slog.New(slog.DiscardHandler),
		LimitSignIn: func(http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				limited++
				w.Header().Set("Retry-After", "1")
				writeError(w, http.StatusTooManyRequests, "too many requests")
			})
		}})
	f.handler = f.console.Wrap(recorder(f.next))
	if res := f.do(jsonRequest(http.MethodPost, "/console/session", `{"apiKey":"`+f.key+`"}`)); res.StatusCode != http.StatusTooManyRequests || len(res.Cookies()) != 0 {
		t.Fatalf("a limited sign-in: %d, want 429 and no session", res.StatusCode)
	}
	for _, r := range []*http.Request{
		httptest.NewRequest(http.MethodGet, "/console/session", nil),
		httptest.NewRequest(http.MethodGet, "/console/", nil),
	} {
		f.do(r)
	}
	if limited != 1 {
		t.Fatalf("the limit saw %d requests, want only the sign-in", limited)
	}
}

func TestSignIn(t *testing.T) {
	f := newFixture(t)
	res := f.do(jsonRequest(http.MethodPost, "/console/session", `{"apiKey":"`+f.key+`"}`))
	if res.StatusCode != http.StatusOK {
		t.Fatalf("sign-in: %d %s", res.StatusCode, body(res))
	}
	raw := strings.Join(res.Header.Values("Set-Cookie"), "\n")
	var s sessionJSON
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	if s.Key.ID != f.keyInfo.ID || s.Key.Team != "alpha" || s.Key.Admin || s.CSRFToken == "" || !s.ExpiresAt.After(time.Now().Add(time.Hour)) {
		t.Fatalf("session %+v, want key %s of team alpha, a CSRF token and an expiry hours away", s, f.keyInfo.ID)
	}
	ck := sessionCookie(t, res)
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || ck.Secure || ck.Name != cookieName {
		t.Fatalf("cookie %q: want HttpOnly, SameSite=Strict, Path=/, not Secure over plain HTTP", raw)
	}
	if strings.Contains(ck.Value, f.key) || strings.Contains(ck.Value, f.keyInfo.SHA256) || strings.Contains(ck.Value, s.CSRFToken) || !sealed.IsSealed(ck.Value) {
		t.Fatalf("cookie value %q holds the key, its hash or the CSRF token in the clear", ck.Value)
	}
	if res.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("Cache-Control %q, want no-store on the session", res.Header.Get("Cache-Control"))
	}

	// Over TLS.
	r := jsonRequest(http.MethodPost, "https://aenv.test/console/session", `{"apiKey":"`+f.key+`"}`)
	if r.TLS == nil {
		t.Fatal("httptest gave an https request no TLS state")
	}
	res = f.do(r)
	if ck := sessionCookie(t, res); !ck.Secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Name != tlsCookieName || ck.Domain != "" {
		t.Fatalf("cookie over TLS %q: want __Host-, Secure, HttpOnly, SameSite=Strict, no Domain", res.Header.Values("Set-Cookie"))
	}

	// A form, as a page without scripts posts it.
	r = httptest.NewRequest(http.MethodPost, "/console/session", strings.NewReader(url.Values{"apiKey": {f.key}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("Accept", "text/html")
	res = f.do(r)
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/console/" {
		t.Fatalf("form sign-in: %d to %q, want 303 to /console/", res.StatusCode, res.Header.Get("Location"))
	}
	sessionCookie(t, res)

	for name, b := range map[string]string{
		"unknown key": `{"apiKey":"e2b_0123456789abcdef0123456789abcdef01234567"}`,
		"not a key":   `{"apiKey":"hunter2"}`,
	} {
		res := f.do(jsonRequest(http.MethodPost, "/console/session", b))
		if res.StatusCode != http.StatusUnauthorized || len(res.Cookies()) != 0 {
			t.Errorf("%s: %d with cookies %v, want 401 and none", name, res.StatusCode, res.Cookies())
		}
		if got := body(res); !strings.Contains(got, `"code":401`) {
			t.Errorf("%s: body %s, want the API's {code, message}", name, got)
		}
	}
	for name, r := range map[string]*http.Request{
		"no key":       jsonRequest(http.MethodPost, "/console/session", `{}`),
		"malformed":    jsonRequest(http.MethodPost, "/console/session", `{"apiKey":`),
		"text body":    httptest.NewRequest(http.MethodPost, "/console/session", strings.NewReader(f.key)),
		"cross-origin": withHeader(jsonRequest(http.MethodPost, "/console/session", `{"apiKey":"`+f.key+`"}`), "Origin", "https://evil.test"),
	} {
		res := f.do(r)
		if res.StatusCode < 400 || res.StatusCode >= 500 || len(res.Cookies()) != 0 {
			t.Errorf("%s: %d with cookies %v, want a 4xx and none", name, res.StatusCode, res.Cookies())
		}
	}
}

func withHeader(r *http.Request, k, v string) *http.Request {
	r.Header.Set(k, v)
	return r
}

func withCookie(r *http.Request, ck *http.Cookie) *http.Request {
	r.AddCookie(ck)
	return r
}

// TestSessionAuthenticates: a request with the session cookie reaches
// next as the session's key, without the cookie; changes need the CSRF
// token (403 without it, or with a wrong one, and next never sees them);
// a key of the request's own wins over the cookie.
func TestSessionAuthenticates(t *testing.T) {
	f := newFixture(t)
	ck, csrf := f.signIn(t, f.key)

	r := withCookie(httptest.NewRequest(http.MethodGet, "/v2/sandboxes", nil), ck)
	r.AddCookie(&http.Cookie{Name: "other", Value: "kept"})
	if res := f.do(r); res.StatusCode != http.StatusTeapot || f.next.key == nil || f.next.key.ID != f.keyInfo.ID {
		t.Fatalf("GET with the session: %d, next saw key %+v; want next, as %s", res.StatusCode, f.next.key, f.keyInfo.ID)
	}
	if f.next.cookie != "other=kept" {
		t.Fatalf("next saw Cookie %q, want only the other cookie", f.next.cookie)
	}

	for name, r := range map[string]*http.Request{
		"no CSRF token":    jsonRequest(http.MethodPost, "/sandboxes/abc/pause", `{}`),
		"wrong CSRF token": withHeader(jsonRequest(http.MethodDelete, "/sandboxes/abc", ``), CSRFHeader, csrf+"x"),
		"empty CSRF token": withHeader(jsonRequest(http.MethodPatch, "/teams/alpha", `{}`), CSRFHeader, ""),
		"other origin":     withHeader(withHeader(jsonRequest(http.MethodPost, "/sandboxes", `{}`), CSRFHeader, csrf), "Origin", "https://evil.test"),
		"cross-site fetch": withHeader(withHeader(jsonRequest(http.MethodPost, "/sandboxes", `{}`), CSRFHeader, csrf), "Sec-Fetch-Site", "cross-site"),
	} {
		res := f.do(withCookie(r, ck))
		if res.StatusCode != http.StatusForbidden || f.next.called {
			t.Errorf("%s: %d (next called: %v), want 403 before next", name, res.StatusCode, f.next.called)
		}
		if b := body(res); !strings.Contains(b, `"code":403`) {
			t.Errorf("%s: body %s, want {code, message}", name, b)
		}
	}
	r = withHeader(withHeader(jsonRequest(http.MethodPost, "/sandboxes/abc/pause", `{}`), CSRFHeader, csrf), "Origin", "http://example.com")
	if res := f.do(withCookie(r, ck)); res.StatusCode != http.StatusTeapot || f.next.key == nil {
		t.Fatalf("POST with the CSRF token from this origin: %d, key %v; want next, authenticated", res.StatusCode, f.next.key)
	}

	// A token of another session does not do.
	_, other := f.signIn(t, f.key)
	if other == csrf {
		t.Fatal("two sign-ins got the same CSRF token")
	}
	r = withHeader(jsonRequest(http.MethodPost, "/sandboxes/abc/pause", `{}`), CSRFHeader, other)
	if res := f.do(withCookie(r, ck)); res.StatusCode != http.StatusForbidden {
		t.Fatalf("another session's CSRF token: %d, want 403", res.StatusCode)
	}

	// The request's own key speaks for it, cookie or not.
	r = withHeader(withCookie(jsonRequest(http.MethodPost, "/sandboxes", `{}`), ck), "X-API-KEY", "e2b_00")
	if res := f.do(r); res.StatusCode != http.StatusTeapot || f.next.key != nil || f.next.cookie != "" {
		t.Fatalf("a request with a key of its own: %d, next saw key %v and Cookie %q; want next, unauthenticated by the console, no cookie", res.StatusCode, f.next.key, f.next.cookie)
	}

	// Sandbox traffic never sees the cookie, even under /console.
	r = withHeader(withCookie(httptest.NewRequest(http.MethodGet, "/console/session", nil), ck), "E2b-Sandbox-Id", "abc")
	if res := f.do(r); res.StatusCode != http.StatusTeapot || f.next.key != nil || f.next.cookie != "" {
		t.Fatalf("sandbox traffic: %d, next saw key %v and Cookie %q; want it passed on without either", res.StatusCode, f.next.key, f.next.cookie)
	}

	// A forged or garbled cookie authenticates nothing.
	for _, v := range []string{"", "garbage", "aenvsealed1:" + f.dataKeys.Current() + ":AAAA", ck.Value[:len(ck.Value)-4] + "AAAA"} {
		r := withCookie(httptest.NewRequest(http.MethodGet, "/v2/sandboxes", nil), &http.Cookie{Name: cookieName, Value: v})
		if res := f.do(r); res.StatusCode != http.StatusTeapot || f.next.key != nil {
			t.Errorf("cookie %q: next saw key %v, want none", v, f.next.key)
		}
	}
}

// TestSessionAcrossServers: a session made by one server is accepted by
// another with the same data key (and its own view of the same keys); a
// server with another data key refuses it.
func TestSessionAcrossServers(t *testing.T) {
	st := state.NewMemory()
	dataKey := sealed.NewKey()
	keysA := openKeys(t, st)
	key, info, err := keysA.Create(context.Background(), apikeys.KeyOptions{Name: "alice", Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	a := newFixtureOn(t, keysA, newKeyring(t, dataKey), key, info)
	b := newFixtureOn(t, openKeys(t, st), newKeyring(t, dataKey), key, info)
	other := newFixtureOn(t, openKeys(t, st), newKeyring(t, sealed.NewKey()), key, info)

	ck, csrf := a.signIn(t, key)
	r := withHeader(jsonRequest(http.MethodPost, "/sandboxes/abc/pause", `{}`), CSRFHeader, csrf)
	if res := b.do(withCookie(r, ck)); res.StatusCode != http.StatusTeapot || b.next.key == nil || b.next.key.ID != info.ID {
		t.Fatalf("server B with server A's session: %d, key %v; want it accepted as %s", res.StatusCode, b.next.key, info.ID)
	}
	res := b.do(withCookie(httptest.NewRequest(http.MethodGet, "/console/session", nil), ck))
	var s sessionJSON
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil || s.CSRFToken != csrf {
		t.Fatalf("server B's GET /console/session: %d %+v %v, want the same CSRF token", res.StatusCode, s, err)
	}
	if res := other.do(withCookie(httptest.NewRequest(http.MethodGet, "/console/session", nil), ck)); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a server with another data key: %d, want 401", res.StatusCode)
	}
}

// TestSessionEnds: a session ends at its expiry, when its key is revoked
// (on any server), and at sign-out, which needs the CSRF token.
func TestSessionEnds(t *testing.T) {
	f := newFixture(t)
	ck, csrf := f.signIn(t, f.key)
	whoami := func() int {
		return f.do(withCookie(httptest.NewRequest(http.MethodGet, "/console/session", nil), ck)).StatusCode
	}
	if code := whoami(); code != http.StatusOK {
		t.Fatalf("GET /console/session: %d, want 200", code)
	}

	f.console.now = func() time.Time { return time.Now().Add(DefaultSessionTTL + time.Minute) }
	if code := whoami(); code != http.StatusUnauthorized {
		t.Fatalf("after its expiry: %d, want 401", code)
	}
	f.do(withCookie(httptest.NewRequest(http.MethodGet, "/v2/sandboxes", nil), ck))
	if f.next.key != nil {
		t.Fatal("an expired session authenticated a request")
	}
	f.console.now = time.Now

	// Sign-out: refused without the token, then done.
	res := f.do(withCookie(httptest.NewRequest(http.MethodDelete, "/console/session", nil), ck))
	if res.StatusCode != http.StatusForbidden {
		t.Fatalf("sign-out without the CSRF token: %d, want 403", res.StatusCode)
	}
	res = f.do(withHeader(withCookie(httptest.NewRequest(http.MethodDelete, "/console/session", nil), ck), CSRFHeader, csrf))
	cleared := sessionCookie(t, res)
	if res.StatusCode != http.StatusNoContent || cleared.MaxAge >= 0 || cleared.Value != "" || !cleared.HttpOnly {
		t.Fatalf("sign-out: %d, cookie %v; want 204 and the cookie cleared", res.StatusCode, res.Header.Values("Set-Cookie"))
	}

	// Revocation.
	ck2, _ := f.signIn(t, f.key)
	if err := f.keys.Revoke(context.Background(), f.keyInfo.ID); err != nil {
		t.Fatal(err)
	}
	if res := f.do(withCookie(httptest.NewRequest(http.MethodGet, "/console/session", nil), ck2)); res.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a revoked key's session: %d, want 401", res.StatusCode)
	}
	f.do(withCookie(httptest.NewRequest(http.MethodGet, "/v2/sandboxes", nil), ck2))
	if f.next.key != nil {
		t.Fatal("a revoked key's session authenticated a request")
	}
}

// TestRoot: a browser's GET / goes to the console; everything else at /
// is next's, as before.
func TestRoot(t *testing.T) {
	f := newFixture(t)
	r := withHeader(httptest.NewRequest(http.MethodGet, "/", nil), "Accept", "text/html,application/xhtml+xml,*/*;q=0.8")
	if res := f.do(r); res.StatusCode != http.StatusFound || res.Header.Get("Location") != "/console/" || f.next.called {
		t.Fatalf("a browser's GET /: %d to %q, want 302 to /console/", res.StatusCode, res.Header.Get("Location"))
	}
	for name, r := range map[string]*http.Request{
		"no Accept":       httptest.NewRequest(http.MethodGet, "/", nil),
		"JSON":            withHeader(httptest.NewRequest(http.MethodGet, "/", nil), "Accept", "application/json"),
		"any":             withHeader(httptest.NewRequest(http.MethodGet, "/", nil), "Accept", "*/*"),
		"with an API key": withHeader(withHeader(httptest.NewRequest(http.MethodGet, "/", nil), "Accept", "text/html"), "X-API-KEY", f.key),
		"POST":            withHeader(httptest.NewRequest(http.MethodPost, "/", nil), "Accept", "text/html"),
		"another path":    withHeader(httptest.NewRequest(http.MethodGet, "/health", nil), "Accept", "text/html"),
	} {
		if res := f.do(r); res.StatusCode != http.StatusTeapot {
			t.Errorf("%s: %d, want next's answer", name, res.StatusCode)
		}
	}
}

// TestNewRefusesNoDataKeys: without a data key a session would be a
// cookie anyone could write.
func TestNewRefusesNoDataKeys(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("New without data keys did not refuse")
		}
	}()
	New(Config{Keys: openKeys(t, state.NewMemory())})
}
