// Package console serves aenv's web console: the page, its scripts and
// styles (embedded in the binary, nothing fetched from elsewhere at run
// time), and the session layer that lets a browser call the API with an
// HttpOnly cookie instead of holding an API key.
//
// The console's pages call the same REST routes the SDKs and the CLI do.
// A signed-in browser's requests reach the API as though they carried the
// key itself (Config.Authenticate), so every team and admin rule of the
// API applies unchanged: what a key may not see, the console does not
// show. The console's own routes, beyond the session, are those that go
// to a sandbox's envd (a terminal, files): they call the API and its
// proxy in process with the CLI's client, as the session's key, so the
// same rules hold there, and the sandbox's envd token stays on the
// server.
//
// A session is a cookie sealed with the cluster's data key, naming the
// key (by id and hash, never the key itself), an expiry and a CSRF token:
// any API server of the cluster opens it, and a revoked key ends every
// session made with it. Requests that change anything must carry the CSRF
// token in a header (double submit of a value only same-origin scripts
// can read), or they are refused with 403.
//
// Only the server wiring (package server) imports it; it links nothing of
// the node side (the client it uses speaks HTTP to the API).
package console

import (
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/sealed"
)

// Path is where the console is served.
const Path = "/console"

// DefaultSessionTTL is how long a sign-in lasts unless Config says.
const DefaultSessionTTL = 12 * time.Hour

// Keys finds the API keys sessions are made from and stand for; an
// *apikeys.Keys is one.
type Keys interface {
	// Lookup finds a key a client presented.
	Lookup(key string) (apikeys.Key, bool)
	// LookupHash finds a key by its SHA-256: false once it is revoked.
	LookupHash(sum string) (apikeys.Key, bool)
}

// Config wires the console.
type Config struct {
	// Keys check sign-ins and sessions.
	Keys Keys
	// DataKeys seal sessions: the cluster's data keys, so that every API
	// server with them accepts a session any of them made. Required.
	DataKeys *sealed.Keyring
	// Authenticate returns r authenticated as k for the handler behind the
	// console (api.WithCaller).
	Authenticate func(r *http.Request, k apikeys.Key) *http.Request
	// SessionTTL is how long a session lasts; 0 means DefaultSessionTTL.
	SessionTTL time.Duration
	// IsSandboxTraffic reports requests addressed to a sandbox (by host
	// or header), which go behind the console untouched but for the
	// session cookie, which a sandbox never sees. Nil: none.
	IsSandboxTraffic func(r *http.Request) bool
	// LimitSignIn, when set, bounds sign-ins (POST /console/session) in
	// front of their key check, as the API bounds its clients
	// (api.Handler.LimitSignIn: per client address): a sign-in carries
	// no key the API's own limit could count it by, and every guess is
	// a key lookup and a log line. Nil: unbounded.
	LimitSignIn func(next http.Handler) http.Handler
	Logger      *slog.Logger
}

// Console serves the console and checks sessions in front of the API.
type Console struct {
	cfg    Config
	log    *slog.Logger
	assets http.Handler
	signIn http.Handler
	now    func() time.Time
}

// New makes the console. It panics without DataKeys: a session sealed
// with no key would be a cookie anyone could write.
func New(cfg Config) *Console {
	if cfg.DataKeys == nil {
		panic("console.New: no data keys to seal sessions with")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	c := &Console{cfg: cfg, log: cfg.Logger, assets: assetHandler(), now: time.Now}
	c.signIn = http.HandlerFunc(c.signInWithKey)
	if cfg.LimitSignIn != nil {
		c.signIn = cfg.LimitSignIn(c.signIn)
	}
	return c
}

// Wrap serves the console in front of next, and next's routes to
// browsers signed in to it:
//
//   - /console and below: the page, its assets, and /console/session
//     (POST signs in, GET tells who is signed in and the CSRF token,
//     DELETE signs out);
//   - /console/api/sandboxes/{id}/: what the page does in a sandbox
//     through envd, whose token the page never holds: terminal (a
//     WebSocket to a shell on a PTY), files (a directory's listing) and
//     files/content (download, and upload with the CSRF token);
//   - GET / from a browser (Accept: text/html, no API key): a redirect to
//     the console; API clients' requests to / are next's as before;
//   - a request with a session cookie and no API key of its own: next's,
//     authenticated as the session's key, once the CSRF token is checked
//     for anything but GET, HEAD and OPTIONS.
//
// The session cookie is taken out of every request that goes to next.
func (c *Console) Wrap(next http.Handler) http.Handler {
	sandboxes := c.sandboxRoutes(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.IsSandboxTraffic != nil && c.cfg.IsSandboxTraffic(r) {
			next.ServeHTTP(w, withoutSessionCookie(r))
			return
		}
		switch {
		case strings.HasPrefix(r.URL.Path, apiPath):
			setPageHeaders(w.Header())
			sandboxes.ServeHTTP(w, r)
			return
		case r.URL.Path == Path || strings.HasPrefix(r.URL.Path, Path+"/"):
			c.serveConsole(w, r)
			return
		case r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead) && wantsHTML(r) && !hasAPIKey(r):
			http.Redirect(w, r, Path+"/", http.StatusFound)
			return
		}
		if hasAPIKey(r) {
			// The key speaks for the request; a cookie beside it is
			// ignored.
			next.ServeHTTP(w, withoutSessionCookie(r))
			return
		}
		sess, ok := c.session(r)
		r = withoutSessionCookie(r)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		if !safeMethod(r.Method) {
			if msg := c.checkChange(r, sess); msg != "" {
				writeError(w, http.StatusForbidden, msg)
				return
			}
		}
		next.ServeHTTP(w, c.cfg.Authenticate(r, sess.key))
	})
}

// serveConsole answers what lies under Path.
func (c *Console) serveConsole(w http.ResponseWriter, r *http.Request) {
	setPageHeaders(w.Header())
	switch rest := strings.TrimPrefix(r.URL.Path, Path); rest {
	case "":
		http.Redirect(w, r, Path+"/", http.StatusMovedPermanently)
	case "/session":
		w.Header().Set("Cache-Control", "no-store")
		switch r.Method {
		case http.MethodPost:
			c.signIn.ServeHTTP(w, r)
		case http.MethodGet, http.MethodHead:
			c.whoami(w, r)
		case http.MethodDelete:
			c.signOut(w, r)
		default:
			w.Header().Set("Allow", "GET, POST, DELETE")
			writeError(w, http.StatusMethodNotAllowed, "/console/session takes GET, POST or DELETE")
		}
	default:
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "the console's pages are read with GET")
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = rest
		c.assets.ServeHTTP(w, r2)
	}
}

// pagePolicy is the console's Content-Security-Policy: everything from
// its own origin only (no CDN could be used by mistake), never framed.
//
// Scripts are 'self' alone: no inline script, no eval, which is what
// keeps an injected string from running. Styles are 'self' and
// 'unsafe-inline', for the terminal: xterm.js writes its cell sizes and
// theme into <style> elements it makes and colours 24-bit cells with style
// attributes. Neither a hash (the text depends on the font as measured in
// the browser) nor a nonce (xterm.js has no way to be given one) can name
// them, and a policy that refuses them leaves a violation in the console
// for each and a terminal drawn wrong. Inline CSS runs no script; what it
// could do with injected markup, load URLs that carry the page's text
// away, img-src, font-src and connect-src hold to this origin, and the
// pages set whatever the API says as text, never as markup.
const pagePolicy = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; font-src 'self'; connect-src 'self'; manifest-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// setPageHeaders keeps the console's pages to their own origin
// (pagePolicy), unframed, sending no referrer.
func setPageHeaders(h http.Header) {
	h.Set("Content-Security-Policy", pagePolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
}

// hasAPIKey reports whether r presents a key of its own (as the API reads
// it: X-API-KEY, or a bearer token).
func hasAPIKey(r *http.Request) bool {
	return r.Header.Get("X-API-Key") != "" || strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// wantsHTML reports whether r comes from a browser navigating: it asks
// for HTML. API clients ask for JSON or anything.
func wantsHTML(r *http.Request) bool {
	for _, part := range strings.Split(r.Header.Get("Accept"), ",") {
		mt, _, _ := strings.Cut(strings.TrimSpace(part), ";")
		if strings.EqualFold(strings.TrimSpace(mt), "text/html") {
			return true
		}
	}
	return false
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}
