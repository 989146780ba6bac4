package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/apikeys"
)

// Cookie names: over TLS the __Host- prefix, which browsers keep to this
// exact host (no Domain, Path /, Secure), so that a sandbox's page on a
// sibling host cannot plant one; in plain HTTP (loopback) that prefix is
// not allowed.
const (
	cookieName    = "aenv_console"
	tlsCookieName = "__Host-aenv_console"
)

// CSRFHeader carries a session's CSRF token on every change.
const CSRFHeader = "X-CSRF-Token"

// sessionAAD binds sealed sessions to their use: a value sealed for
// something else does not open as a session.
const sessionAAD = "aenv console session v1"

// maxSignInBytes bounds a sign-in's body (a key is ~44 bytes).
const maxSignInBytes = 8 << 10

// sessionData is what a session cookie holds, sealed.
type sessionData struct {
	KeyID string `json:"k"`
	// KeyHash is the key's SHA-256, by which it is found (and its id
	// checked against).
	KeyHash string `json:"h"`
	Expires int64  `json:"e"` // Unix seconds
	CSRF    string `json:"c"`
}

// session is an open, current session.
type session struct {
	key     apikeys.Key
	csrf    string
	expires time.Time
}

// sessionJSON is what GET and POST /console/session answer.
type sessionJSON struct {
	Key struct {
		ID    string `json:"id"`
		Name  string `json:"name"`
		Team  string `json:"team"`
		Admin bool   `json:"admin"`
	} `json:"key"`
	// CSRFToken goes in the X-CSRF-Token header of every change.
	CSRFToken string    `json:"csrfToken"`
	ExpiresAt time.Time `json:"expiresAt"`
}

func toJSON(s session) sessionJSON {
	var out sessionJSON
	out.Key.ID, out.Key.Name, out.Key.Team, out.Key.Admin = s.key.ID, s.key.Name, s.key.Team, s.key.Admin
	out.CSRFToken, out.ExpiresAt = s.csrf, s.expires.UTC()
	return out
}

func cookieNameFor(r *http.Request) string {
	if r.TLS != nil {
		return tlsCookieName
	}
	return cookieName
}

// session opens r's session cookie, if it has a current one whose key
// the cluster still has.
func (c *Console) session(r *http.Request) (session, bool) {
	ck, err := r.Cookie(cookieNameFor(r))
	if err != nil || ck.Value == "" {
		return session{}, false
	}
	plain, err := c.cfg.DataKeys.Open(ck.Value, sessionAAD)
	if err != nil || plain == ck.Value {
		// Not sealed, or not by a key of this cluster.
		return session{}, false
	}
	var d sessionData
	if err := json.Unmarshal([]byte(plain), &d); err != nil || d.CSRF == "" || d.KeyHash == "" {
		return session{}, false
	}
	expires := time.Unix(d.Expires, 0)
	if !c.now().Before(expires) {
		return session{}, false
	}
	k, ok := c.cfg.Keys.LookupHash(d.KeyHash)
	if !ok || k.ID != d.KeyID {
		return session{}, false
	}
	return session{key: k, csrf: d.CSRF, expires: expires}, true
}

// checkChange is why a change r asks for under session s is refused ("":
// it is not): it must carry the session's CSRF token and come from this
// origin.
func (c *Console) checkChange(r *http.Request, s session) string {
	if msg := checkOrigin(r); msg != "" {
		return msg
	}
	got := r.Header.Get(CSRFHeader)
	if got == "" {
		return "missing CSRF token: a console session's changes carry it in the " + CSRFHeader + " header"
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) != 1 {
		return "wrong CSRF token for this console session"
	}
	return ""
}

// checkOrigin refuses requests a browser says come from another site:
// a defence besides the CSRF token (and the only one a sign-in has).
func checkOrigin(r *http.Request) string {
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return "cross-site requests are refused"
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return "requests from another origin are refused"
		}
	}
	return ""
}

// signInWithKey answers POST /console/session: an API key (JSON
// {"apiKey"} or a form's apiKey field) exchanged for a session cookie.
func (c *Console) signInWithKey(w http.ResponseWriter, r *http.Request) {
	if msg := checkOrigin(r); msg != "" {
		writeError(w, http.StatusForbidden, msg)
		return
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	body := http.MaxBytesReader(w, r.Body, maxSignInBytes)
	var key string
	switch mt {
	case "application/json":
		var in struct {
			APIKey string `json:"apiKey"`
		}
		if err := json.NewDecoder(body).Decode(&in); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeError(w, http.StatusRequestEntityTooLarge, "sign-in body too large")
				return
			}
			writeError(w, http.StatusBadRequest, "malformed JSON body: want {\"apiKey\": \"e2b_...\"}")
			return
		}
		key = in.APIKey
	case "application/x-www-form-urlencoded":
		b, err := io.ReadAll(body)
		if err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, "sign-in body too large")
			return
		}
		v, err := url.ParseQuery(string(b))
		if err != nil {
			writeError(w, http.StatusBadRequest, "malformed form body")
			return
		}
		key = v.Get("apiKey")
	default:
		writeError(w, http.StatusUnsupportedMediaType, "sign in with a JSON body {\"apiKey\": ...} or a form with an apiKey field")
		return
	}
	key = strings.TrimSpace(key)
	if key == "" {
		writeError(w, http.StatusBadRequest, "apiKey is required")
		return
	}
	k, ok := c.cfg.Keys.Lookup(key)
	if !ok {
		c.log.Info("console sign-in refused", "remote", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, "invalid API key")
		return
	}
	s := session{key: k, csrf: randomToken(), expires: c.now().Add(c.cfg.SessionTTL).Truncate(time.Second)}
	b, err := json.Marshal(sessionData{KeyID: k.ID, KeyHash: k.SHA256, Expires: s.expires.Unix(), CSRF: s.csrf})
	if err != nil {
		writeError(w, http.StatusInternalServerError, "making a session: "+err.Error())
		return
	}
	http.SetCookie(w, &http.Cookie{
		Name:     cookieNameFor(r),
		Value:    c.cfg.DataKeys.Seal(string(b), sessionAAD),
		Path:     "/",
		Expires:  s.expires,
		MaxAge:   int(c.cfg.SessionTTL / time.Second),
		Secure:   r.TLS != nil,
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
	})
	c.log.Info("console sign-in", "key_id", k.ID, "team", k.Team, "admin", k.Admin)
	if mt == "application/x-www-form-urlencoded" && wantsHTML(r) {
		// A form posted without scripts: back to the page, which asks
		// GET /console/session for the rest.
		http.Redirect(w, r, Path+"/", http.StatusSeeOther)
		return
	}
	writeJSON(w, http.StatusOK, toJSON(s))
}

// whoami answers GET /console/session.
func (c *Console) whoami(w http.ResponseWriter, r *http.Request) {
	s, ok := c.session(r)
	if !ok {
		writeError(w, http.StatusUnauthorized, "not signed in to the console")
		return
	}
	writeJSON(w, http.StatusOK, toJSON(s))
}

// signOut answers DELETE /console/session: the cookie is cleared. A
// current session must show its CSRF token; one that no longer opens is
// cleared all the same.
func (c *Console) signOut(w http.ResponseWriter, r *http.Request) {
	if s, ok := c.session(r); ok {
		if msg := c.checkChange(r, s); msg != "" {
			writeError(w, http.StatusForbidden, msg)
			return
		}
		c.log.Info("console sign-out", "key_id", s.key.ID)
	}
	http.SetCookie(w, &http.Cookie{
		Name:     cookieNameFor(r),
		Value:    "",
		Path:     "/",
		MaxAge:   -1,
		Secure:   r.TLS != nil,
		HttpOnly: true,
		SameSite: http.SameSiteStrictMode,
	})
	w.WriteHeader(http.StatusNoContent)
}

// withoutSessionCookie is r without the console's cookies in its Cookie
// header, so that nothing behind the console (a sandbox above all) sees
// them; r itself is left as it is.
func withoutSessionCookie(r *http.Request) *http.Request {
	all := r.Cookies()
	kept := make([]string, 0, len(all))
	dropped := false
	for _, ck := range all {
		if ck.Name == cookieName || ck.Name == tlsCookieName {
			dropped = true
			continue
		}
		kept = append(kept, ck.Name+"="+ck.Value)
	}
	if !dropped {
		return r
	}
	r = r.Clone(r.Context())
	r.Header.Del("Cookie")
	if len(kept) > 0 {
		r.Header.Set("Cookie", strings.Join(kept, "; "))
	}
	return r
}

// randomToken is a CSRF token: 128 random bits.
func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// apiError is the API's error body, {code, message}.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, apiError{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
