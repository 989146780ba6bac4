package api

import (
	"context"
	"errors"
	"testing"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/buildjob"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
)

// scriptedNode answers builds with lines, then a failure with err (a
// node that runs no step); contexts are taken and dropped.
type scriptedNode struct {
	nodeapi.Node // only ID, Build, Pull and PutBuildContext are called
	lines        []string
	err          string
}

func (scriptedNode) ID() string { return "test-node" }

func (scriptedNode) PutBuildContext(context.Context, *nodev1.PutBuildContextRequest) (*nodev1.PutBuildContextResponse, error) {
	return &nodev1.PutBuildContextResponse{}, nil
}

func (n scriptedNode) Build(ctx context.Context, _ *nodev1.BuildRequest, fn func(*nodev1.BuildEvent)) error {
	if len(n.lines) > 0 {
		fn(&nodev1.BuildEvent{Lines: n.lines})
	}
	if n.err == "" {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this test runs no build steps"))
	}
	fn(&nodev1.BuildEvent{Result: &nodev1.BuildResult{Error: n.err, FailedStep: -1}})
	return nil
}

// Pull fails as a pull of an image the node cannot find would.
func (scriptedNode) Pull(ctx context.Context, r *nodev1.PullRequest, fn func(*nodev1.PullEvent)) error {
	fn(&nodev1.PullEvent{Result: &nodev1.PullResult{Error: "pulling " + r.Ref + ": this test pulls nothing: image not found",
		ErrorClass: nodev1.PullResult_ERROR_CLASS_NOT_FOUND}})
	return nil
}

// NewTestJobs is a build job keeper on an in-memory state whose builds run
// on n (for the tests of package api and api_test).
func NewTestJobs(t testing.TB, n nodeapi.Node) *buildjob.Jobs {
	return newJobs(t, buildjob.Config{Node: func(context.Context) (nodeapi.Node, error) { return n, nil }})
}

// LimitedJobs are RefusingJobs whose builds ask limiter first.
func LimitedJobs(t testing.TB, limiter func(ctx context.Context, team string) (func(), error)) *buildjob.Jobs {
	return newJobs(t, buildjob.Config{Limiter: limiter,
		Node: func(context.Context) (nodeapi.Node, error) { return scriptedNode{}, nil }})
}

func newJobs(t testing.TB, cfg buildjob.Config) *buildjob.Jobs {
	t.Helper()
	st := state.NewMemory()
	cfg.State, cfg.Server = st, "test"
	j, err := buildjob.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		j.Close(context.Background())
		st.Close()
	})
	return j
}

// RefusingJobs enables the build routes for tests that must never get as
// far as running a step.
func RefusingJobs(t testing.TB) *buildjob.Jobs { return NewTestJobs(t, scriptedNode{}) }
