package nodetest_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// TestMain fails the package's tests if a goroutine outlives them (an
// Events stream the suite did not end).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// FakeOptions are the suite's options for f: it does everything.
func fakeOptions(f *nodetest.Fake) nodetest.Options {
	return nodetest.Options{
		Template: nodetest.FakeTemplate, Snapshots: true, Volumes: true,
		Crash:  func(t *testing.T, id string) { f.Exit(id, "crashed on purpose") },
		Getenv: func(t *testing.T, sb *nodev1.Sandbox, name string) string { return f.EnvVars(sb.Id)[name] },
	}
}

// TestFake holds the fake node the cluster's tests run over to the
// contract the real node keeps.
func TestFake(t *testing.T) {
	f := nodetest.NewFake("fake1")
	nodetest.Run(t, f, fakeOptions(f))
	if n := f.Running(); n != 0 {
		t.Errorf("%d sandboxes left running after the suite", n)
	}
}
