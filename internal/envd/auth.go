package envd

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem/filesystemconnect"
	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
)

// accessTokenHeader carries the sandbox's access token on every request.
const accessTokenHeader = "X-Access-Token"

// withAuth enforces the access token on everything but /health and CORS
// preflights. /files also accepts the signed URLs the SDK hands out
// (uploadUrl, downloadUrl) in place of the header.
func (s *Server) withAuth(next http.Handler) http.Handler {
	errw := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || r.Method == http.MethodOptions {
			next.ServeHTTP(w, r)
			return
		}
		if s.cfg.checkToken(r.Header.Get(accessTokenHeader)) || (r.URL.Path == "/files" && s.validSignature(r)) {
			next.ServeHTTP(w, r)
			return
		}
		if isRPC(r) {
			_ = errw.Write(w, r, connect.NewError(connect.CodeUnauthenticated, errUnauthorized))
			return
		}
		writeJSONError(w, http.StatusUnauthorized, errUnauthorized.Error())
	})
}

// isRPC tells Connect calls from the plain HTTP endpoints, which answer
// errors differently.
func isRPC(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/"+processconnect.ProcessName+"/") ||
		strings.HasPrefix(r.URL.Path, "/"+filesystemconnect.FilesystemName+"/")
}

// validSignature checks the signature query parameter the SDK derives from
// the token: "v1_" + base64(sha256("path:operation:user:token[:expiry]"))
// without padding, operation being "read" for GET and "write" for POST.
func (s *Server) validSignature(r *http.Request) bool {
	token := s.cfg.token()
	q := r.URL.Query()
	sig := q.Get("signature")
	if token == "" || sig == "" {
		return false
	}
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + token
	if exp := q.Get("signature_expiration"); exp != "" {
		secs, err := strconv.ParseInt(exp, 10, 64)
		if err != nil || time.Now().Unix() > secs {
			return false
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
	return subtle.ConstantTimeCompare([]byte(sig), []byte(want)) == 1
}

// withCORS lets browser clients (the SDK also runs in browsers) reach envd.
func (s *Server) withCORS(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Expose-Headers", "*")
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE, OPTIONS")
			if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
				h.Set("Access-Control-Allow-Headers", req)
			}
			h.Set("Access-Control-Max-Age", "7200")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}
