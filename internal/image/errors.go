package image

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// classifyRemote wraps a registry error in the sentinel that says what
// went wrong, with a one-line explanation and what to do about it.
func classifyRemote(registry string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrForbidden) {
		return err
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		detail := oneLine(diagnostics(terr))
		switch {
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden ||
			hasCode(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return fmt.Errorf("%w by %s (%s): check that the repository exists, or give the server credentials for %s (--registry-auth)",
				ErrUnauthorized, registry, detail, registry)
		case terr.StatusCode == http.StatusNotFound ||
			hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode):
			return fmt.Errorf("%w in %s (%s): check the repository and tag", ErrNotFound, registry, detail)
		case terr.StatusCode == http.StatusTooManyRequests:
			return fmt.Errorf("%w: %s is rate-limiting us (%s)", ErrUnreachable, registry, detail)
		default:
			return fmt.Errorf("registry %s: %s", registry, detail)
		}
	}
	var uerr x509.UnknownAuthorityError
	var herr *x509.HostnameError
	if errors.As(err, &uerr) || errors.As(err, &herr) {
		return fmt.Errorf("%w: %s's TLS certificate is not trusted (%v); use --insecure to skip verification", ErrUnreachable, registry, rootCause(err))
	}
	if strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		return fmt.Errorf("%w: %s speaks plain HTTP; use --insecure", ErrUnreachable, registry)
	}
	var nerr net.Error
	var operr *net.OpError
	var dnserr *net.DNSError
	if errors.As(err, &operr) || errors.As(err, &dnserr) || errors.As(err, &nerr) {
		return fmt.Errorf("%w: %s: %v", ErrUnreachable, registry, rootCause(err))
	}
	return err
}

// diagnostics gives a registry error's codes and messages without the
// request line.
func diagnostics(terr *transport.Error) string {
	if len(terr.Errors) == 0 {
		return fmt.Sprintf("HTTP %d %s", terr.StatusCode, http.StatusText(terr.StatusCode))
	}
	var parts []string
	for _, d := range terr.Errors {
		s := string(d.Code)
		if d.Message != "" {
			s += ": " + d.Message
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func hasCode(terr *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range terr.Errors {
		for _, c := range codes {
			if d.Code == c {
				return true
			}
		}
	}
	return false
}

// rootCause is the innermost network error: "dial tcp 127.0.0.1:1:
// connect: connection refused" rather than the URL-laden wrapping.
func rootCause(err error) error {
	var operr *net.OpError
	if errors.As(err, &operr) {
		return operr
	}
	var dnserr *net.DNSError
	if errors.As(err, &dnserr) {
		return dnserr
	}
	return err
}

// oneLine keeps an error's detail to one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
