package cluster

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine the cluster starts has an owner that Close ends.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
