package nodeapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// TestMain fails the package's tests if a goroutine outlives them: a
// stream or connection the client or handler left open.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve serves n's node API behind token on a test server and returns
// its host:port; both end with t.
func serve(t *testing.T, n nodeapi.Node, token string) string {
	mux := http.NewServeMux()
	path, h := nodeapi.Handler(n)
	mux.Handle(path, nodeapi.RequireToken(token, slog.New(slog.DiscardHandler), h))
	srv := httptest.NewUnstartedServer(mux)
	srv.EnableHTTP2 = true
	srv.Start()
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// dial is a Remote of addr whose idle connections close with t.
func dial(t *testing.T, id, addr, token string) *nodeapi.Remote {
	rt := nodeapi.Transport(token)
	t.Cleanup(func() { rt.(interface{ CloseIdleConnections() }).CloseIdleConnections() })
	return nodeapi.Dial(id, addr, rt)
}

// TestRemoteOverFake runs the suite through the wire: the handler and
// the client must carry every field and every error code across as the
// node answered them.
func TestRemoteOverFake(t *testing.T) {
	f := nodetest.NewFake("fake1")
	r := dial(t, f.ID(), serve(t, f, "secret"), "secret")
	nodetest.Run(t, r, nodetest.Options{
		Template: nodetest.FakeTemplate, Snapshots: true, Volumes: true,
		Crash:  func(t *testing.T, id string) { f.Exit(id, "crashed on purpose") },
		Getenv: func(t *testing.T, sb *nodev1.Sandbox, name string) string { return f.EnvVars(sb.Id)[name] },
	})
	if n := f.Running(); n != 0 {
		t.Errorf("%d sandboxes left running after the suite", n)
	}
}

// TestRemoteToken: a node agent answers only requests carrying the
// cluster token, and a refusal is Unauthenticated, not a node error.
func TestRemoteToken(t *testing.T) {
	f := nodetest.NewFake("fake1")
	addr := serve(t, f, "secret")
	ctx := context.Background()
	for _, token := range []string{"wrong", ""} {
		_, err := dial(t, f.ID(), addr, token).Create(ctx, &nodev1.CreateRequest{Source: &nodev1.CreateRequest_TemplateId{TemplateId: nodetest.FakeTemplate}})
		if code := nodeapi.Code(err); code != connect.CodeUnauthenticated {
			t.Errorf("a create with token %q: %v (code %v), want unauthenticated", token, err, code)
		}
	}
	if n := f.Running(); n != 0 {
		t.Errorf("refused creates started %d sandboxes", n)
	}
	if _, err := dial(t, f.ID(), addr, "secret").Create(ctx, &nodev1.CreateRequest{Source: &nodev1.CreateRequest_TemplateId{TemplateId: nodetest.FakeTemplate}}); err != nil {
		t.Errorf("a create with the token: %v", err)
	}
}

// TestMessage: Message is the node's own words, without Connect's code
// prefix, and an error from elsewhere is Unknown.
func TestMessage(t *testing.T) {
	err := connect.NewError(connect.CodeNotFound, errString("sandbox x not found"))
	if got := nodeapi.Message(err); got != "sandbox x not found" {
		t.Errorf("Message = %q", got)
	}
	if got := nodeapi.Code(errString("plain")); got != connect.CodeUnknown {
		t.Errorf("Code of a plain error = %v, want unknown", got)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
