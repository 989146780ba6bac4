package nodeapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// errNode answers Create and Kill with the errors it is given; the rest
// of Node is not called.
type errNode struct {
	Node
	createErr, killErr error
}

func (n *errNode) Create(context.Context, *nodev1.CreateRequest) (*nodev1.Sandbox, error) {
	return nil, n.createErr
}

func (n *errNode) Kill(context.Context, *nodev1.KillRequest) (*nodev1.KillResponse, error) {
	return nil, n.killErr
}

// TestErrorClasses: what the node side returns (NewError, or a bare
// class as a fake's) matches its class with errors.Is, in-process and
// through Remote across the wire, and no other class.
func TestErrorClasses(t *testing.T) {
	cases := []struct {
		name  string
		err   error
		class error
		code  connect.Code
	}{
		{"NewError not found", NewError(connect.CodeNotFound, errors.New("sandbox x not found")), ErrNotFound, connect.CodeNotFound},
		{"NewError exhausted", NewError(connect.CodeResourceExhausted, errors.New("node full")), ErrResourceExhausted, connect.CodeResourceExhausted},
		{"NewError exists", NewError(connect.CodeAlreadyExists, errors.New("id taken")), ErrExists, connect.CodeAlreadyExists},
		{"bare invalid", fmt.Errorf("%w: bad kind", ErrInvalid), ErrInvalid, connect.CodeInvalidArgument},
		{"bare unavailable", fmt.Errorf("%w: not ready", ErrUnavailable), ErrUnavailable, connect.CodeUnavailable},
		{"bare precondition", fmt.Errorf("%w: other runtime", ErrFailedPrecondition), ErrFailedPrecondition, connect.CodeFailedPrecondition},
	}
	classes := []error{ErrNotFound, ErrExists, ErrInvalid, ErrResourceExhausted, ErrFailedPrecondition, ErrUnimplemented, ErrUnavailable, ErrCanceled}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := &errNode{createErr: tc.err}
			path, h := Handler(n)
			mux := http.NewServeMux()
			mux.Handle(path, h)
			srv := httptest.NewServer(mux)
			defer srv.Close()
			remote := Dial("n1", strings.TrimPrefix(srv.URL, "http://"), http.DefaultTransport)
			_, remoteErr := remote.Create(context.Background(), &nodev1.CreateRequest{})
			for where, err := range map[string]error{"in-process": tc.err, "remote": remoteErr} {
				for _, c := range classes {
					if got, want := errors.Is(err, c), c == tc.class; got != want {
						t.Errorf("%s: errors.Is(%v, %v) = %v, want %v", where, err, c, got, want)
					}
				}
			}
			if got := Code(remoteErr); got != tc.code {
				t.Errorf("code on the wire = %v, want %v", got, tc.code)
			}
			if msg := Message(remoteErr); !strings.Contains(msg, Message(tc.err)) {
				t.Errorf("remote message %q lost the node's %q", msg, Message(tc.err))
			}
		})
	}
}

// TestUnclassifiedError: an error of no class crosses as Unknown and
// matches none.
func TestUnclassifiedError(t *testing.T) {
	n := &errNode{killErr: errors.New("disk on fire")}
	path, h := Handler(n)
	mux := http.NewServeMux()
	mux.Handle(path, h)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	_, err := Dial("n1", strings.TrimPrefix(srv.URL, "http://"), http.DefaultTransport).Kill(context.Background(), &nodev1.KillRequest{})
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrUnavailable) || Code(err) != connect.CodeUnknown {
		t.Fatalf("got %v (code %v), want an unclassified Unknown error", err, Code(err))
	}
}
