package interpreter

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// AccessTokenHeader carries the sandbox's envd access token, which
// @e2b/code-interpreter sends with every execution.
const AccessTokenHeader = "X-Access-Token"

// errBadToken is a token envd refused.
var errBadToken = errors.New("missing or wrong access token: send the sandbox's envd access token in " + AccessTokenHeader)

// withAuth admits a request only with the token envd currently demands:
// /execute always, the context routes when they carry one. /health stays
// open for the template's ready check.
//
// The SDK sends the token with runCode only, never with its context calls
// (createCodeContext, listCodeContexts, restartCodeContext,
// removeCodeContext): demanding it there would break them. They run no
// code, and a token they do send must be the right one.
func (s *Server) withAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token := r.Header.Get(AccessTokenHeader)
		if r.URL.Path == "/health" || (token == "" && r.URL.Path != "/execute") {
			next.ServeHTTP(w, r)
			return
		}
		switch err := s.checkToken(r.Context(), token); {
		case errors.Is(err, errBadToken):
			writeError(w, http.StatusUnauthorized, err.Error())
		case err != nil:
			s.log.Warn("checking an access token", "err", err)
			writeError(w, http.StatusServiceUnavailable, err.Error())
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// checkToken asks envd whether token is the sandbox's: HEAD /envs, which
// envd answers only for its current token, and for anything when the
// sandbox has none (created insecure).
//
// Asked every time, never cached: this process is restored from the
// template's snapshot into every sandbox, and from a pause's or a fork's,
// with whatever it remembered, while envd gets each sandbox's token through
// /init after the restore. envd is the one place that knows the current
// token, and it never leaves envd (processes in the sandbox, the code run
// here included, cannot read it).
func (s *Server) checkToken(ctx context.Context, token string) error {
	if s.cfg.EnvdURL == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, s.cfg.EnvdURL+"/envs", nil)
	if err != nil {
		return fmt.Errorf("checking the access token with envd: %w", err)
	}
	if token != "" {
		req.Header.Set(AccessTokenHeader, token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("checking the access token with envd: %w", err)
	}
	res.Body.Close()
	switch res.StatusCode {
	case http.StatusOK:
		return nil
	case http.StatusUnauthorized:
		return errBadToken
	default:
		return fmt.Errorf("checking the access token with envd: it answered %s", res.Status)
	}
}
