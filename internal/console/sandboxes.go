package console

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/ids"
)

// apiPath is where the console's own routes are: what a browser cannot
// do with the API's routes and a cookie alone, because it goes to a
// sandbox's envd, whose access token stays on the server.
const apiPath = Path + "/api/sandboxes/"

// sandboxRoutes answers apiPath{id}/terminal, {id}/files and
// {id}/files/content, for a signed-in browser. Each first reads the
// sandbox through the API as the session's key, so that a key that may
// not see a sandbox gets the API's answer (404) and nothing else; the
// sandbox's envd token comes from that answer and never reaches the
// page.
func (c *Console) sandboxRoutes(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		id, route, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, apiPath), "/")
		var allow string
		var serve func(http.ResponseWriter, *http.Request, *sandboxCall)
		switch route {
		case "terminal":
			allow, serve = http.MethodGet, c.terminal
		case "files":
			allow, serve = http.MethodGet, c.listFiles
		case "files/content":
			allow = "GET, POST"
			serve = c.download
			if r.Method == http.MethodPost {
				serve = c.upload
			}
		default:
			writeError(w, http.StatusNotFound, "no console route "+r.URL.Path)
			return
		}
		if !slices.Contains(strings.Split(allow, ", "), r.Method) {
			w.Header().Set("Allow", allow)
			writeError(w, http.StatusMethodNotAllowed, r.URL.Path+" takes "+allow)
			return
		}
		sess, ok := c.session(r)
		if !ok {
			writeError(w, http.StatusUnauthorized, "not signed in to the console")
			return
		}
		if !ids.Valid(id) {
			writeError(w, http.StatusBadRequest, "invalid sandbox id: ids match ^[a-z0-9]{1,64}$")
			return
		}
		if !safeMethod(r.Method) {
			if msg := c.checkChange(r, sess); msg != "" {
				writeError(w, http.StatusForbidden, msg)
				return
			}
		}
		r = withoutSessionCookie(r)
		call := &sandboxCall{id: id, key: sess.key, client: c.apiClient(next, r, sess.key), csrf: sess.csrf}
		serve(w, r, call)
	})
}

// sandboxCall is one console request about a sandbox: which, as whom,
// and a client of the API that calls it as that key.
type sandboxCall struct {
	id     string
	key    apikeys.Key
	client *client.Client
	csrf   string
	// token is the sandbox's envd access token, once open has read it.
	token string
}

// open reads the sandbox as the caller's key: false (and the API's
// answer written) when the key may not see it or it is not there.
func (sc *sandboxCall) open(ctx context.Context, w http.ResponseWriter) bool {
	sb, err := sc.client.Get(ctx, sc.id)
	if err != nil {
		writeUpstreamError(w, err)
		return false
	}
	sc.token = sb.EnvdAccessToken
	return true
}

// apiClient is a client of the API behind the console (next), in
// process, whose requests are authenticated as k and come from r's
// client.
func (c *Console) apiClient(next http.Handler, r *http.Request, k apikeys.Key) *client.Client {
	remote, tls := r.RemoteAddr, r.TLS
	return client.NewWithTransport("http://"+r.Host, "", handlerTransport{
		h: next,
		prepare: func(in *http.Request) *http.Request {
			in.RemoteAddr, in.TLS = remote, tls
			in.Header.Del("X-API-Key")
			return c.cfg.Authenticate(in, k)
		},
		onPanic: func(v any) { c.log.Error("console: a handler panicked", "panic", fmt.Sprint(v)) },
	})
}

// writeUpstreamError answers with what the API, the proxy or envd said,
// as the console's JSON error. A 401 from behind the console is envd
// refusing a token, not the browser's session ending: it is a 502 here,
// so that the page does not sign out.
func writeUpstreamError(w http.ResponseWriter, err error) {
	var apiErr *client.APIError
	var connErr *connect.Error
	switch {
	case errors.As(err, &apiErr):
		code := apiErr.Status
		if code == http.StatusUnauthorized || code < 400 || code > 599 {
			code = http.StatusBadGateway
		}
		writeError(w, code, apiErr.Message)
	case errors.As(err, &connErr):
		writeError(w, connectStatus(connErr.Code()), connErr.Message())
	case errors.Is(err, context.Canceled):
		writeError(w, http.StatusBadGateway, "the request ended before the sandbox answered")
	default:
		writeError(w, http.StatusBadGateway, err.Error())
	}
}

// connectStatus is the HTTP status for a Connect error from envd (or
// from the proxy in front of it).
func connectStatus(code connect.Code) int {
	switch code {
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	default:
		return http.StatusBadGateway
	}
}

// filePath is the path query parameter of a files route: required for
// content, "~" (the user's home) for a listing.
func filePath(w http.ResponseWriter, r *http.Request, def string) (string, bool) {
	p := r.URL.Query().Get("path")
	if p == "" {
		p = def
	}
	if p == "" {
		writeError(w, http.StatusBadRequest, "path is required")
		return "", false
	}
	if len(p) > 4096 || strings.ContainsRune(p, 0) {
		writeError(w, http.StatusBadRequest, "invalid path")
		return "", false
	}
	return p, true
}

// fileListJSON is what a listing answers.
type fileListJSON struct {
	Path    string         `json:"path"`
	Entries []client.Entry `json:"entries"`
}

// listFiles answers GET {id}/files?path=: the directory's entries.
func (c *Console) listFiles(w http.ResponseWriter, r *http.Request, sc *sandboxCall) {
	p, ok := filePath(w, r, "~")
	if !ok || !sc.open(r.Context(), w) {
		return
	}
	entries, err := sc.client.ListDir(r.Context(), sc.id, p, client.FileOptions{AccessToken: sc.token})
	if err != nil {
		writeUpstreamError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fileListJSON{Path: p, Entries: entries})
}

// download answers GET {id}/files/content?path=: the file's bytes, as an
// attachment (never shown as a page of this origin).
func (c *Console) download(w http.ResponseWriter, r *http.Request, sc *sandboxCall) {
	p, ok := filePath(w, r, "")
	if !ok || !sc.open(r.Context(), w) {
		return
	}
	body, size, err := sc.client.Download(r.Context(), sc.id, p, client.FileOptions{AccessToken: sc.token})
	if err != nil {
		writeUpstreamError(w, err)
		return
	}
	defer body.Close()
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	name := path.Base(p)
	if name == "/" || name == "." {
		name = "download"
	}
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": name}))
	if size >= 0 {
		h.Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, body); err != nil {
		c.log.Info("console download cut", "sandbox_id", sc.id, "path", p, "err", err)
	}
}

// upload answers POST {id}/files/content?path= (CSRF token checked): the
// body becomes the file, created with its directories or truncated.
func (c *Console) upload(w http.ResponseWriter, r *http.Request, sc *sandboxCall) {
	p, ok := filePath(w, r, "")
	if !ok || !sc.open(r.Context(), w) {
		return
	}
	// Upload timeouts are the browser's to set: the body may be large.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	opts := client.FileOptions{AccessToken: sc.token}
	if r.ContentLength > 0 {
		opts.Size = r.ContentLength
	}
	if err := sc.client.Upload(r.Context(), sc.id, p, r.Body, opts); err != nil {
		writeUpstreamError(w, err)
		return
	}
	c.log.Info("console upload", "sandbox_id", sc.id, "path", p, "key_id", sc.key.ID, "bytes", r.ContentLength)
	w.WriteHeader(http.StatusNoContent)
}
