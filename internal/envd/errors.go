package envd

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"syscall"

	"connectrpc.com/connect"
)

// Sentinel errors classify failures; Connect codes and HTTP statuses are
// chosen from them only at the edge (connectError, httpError).
var (
	errNotFound       = errors.New("not found")
	errAlreadyExists  = errors.New("already exists")
	errInvalid        = errors.New("invalid argument")
	errUnknownUser    = errors.New("unknown user")
	errUnauthorized   = errors.New("missing or wrong access token")
	errProcessExited  = errors.New("process has exited")
	errNotImplemented = errors.New("not supported on this platform")
	errForbidden      = errors.New("forbidden")
)

// classify maps an error to a Connect code; OS errors are recognised too.
func classify(err error) connect.Code {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return ce.Code()
	case errors.Is(err, errNotFound), errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR), errors.Is(err, errProcessExited):
		return connect.CodeNotFound
	case errors.Is(err, errAlreadyExists), errors.Is(err, fs.ErrExist):
		return connect.CodeAlreadyExists
	case errors.Is(err, errInvalid), errors.Is(err, errUnknownUser),
		// A path the kernel refuses (too long, a NUL in it) is the
		// client's to fix; the message names it.
		errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL):
		return connect.CodeInvalidArgument
	case errors.Is(err, errUnauthorized):
		return connect.CodeUnauthenticated
	case errors.Is(err, fs.ErrPermission), errors.Is(err, errForbidden):
		return connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return connect.CodeResourceExhausted
	case errors.Is(err, errNotImplemented):
		return connect.CodeUnimplemented
	case errors.Is(err, context.DeadlineExceeded):
		return connect.CodeDeadlineExceeded
	case errors.Is(err, context.Canceled):
		return connect.CodeCanceled
	default:
		return connect.CodeInternal
	}
}

// connectError turns err into the *connect.Error an RPC returns.
func connectError(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	return connect.NewError(classify(err), err)
}

// httpStatus maps an error to the status a plain HTTP endpoint answers with.
func httpStatus(err error) int {
	switch classify(err) {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists:
		return http.StatusConflict
	case connect.CodeInvalidArgument:
		return http.StatusBadRequest
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusInsufficientStorage
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	default:
		return http.StatusInternalServerError
	}
}

// writeJSONError writes the {"code","message"} body E2B clients parse.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

func writeHTTPError(w http.ResponseWriter, err error) {
	writeJSONError(w, httpStatus(err), err.Error())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
