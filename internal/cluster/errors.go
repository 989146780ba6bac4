package cluster

import (
	"errors"
	"fmt"

	"github.com/aenvhq/aenv/internal/nodeapi"
)

// nodeClasses pairs the node API's error classes with the cluster's.
// Not-found is left out: what was not found depends on the call.
var nodeClasses = []struct{ node, cluster error }{
	{nodeapi.ErrInvalid, ErrInvalid},
	{nodeapi.ErrResourceExhausted, ErrNoCapacity},
	{nodeapi.ErrFailedPrecondition, ErrConflict},
	{nodeapi.ErrExists, ErrConflict},
	{nodeapi.ErrUnimplemented, ErrUnsupported},
	{nodeapi.ErrUnavailable, ErrUnavailable},
}

// classifyNodeError puts a node API error into the cluster's error
// classes, keeping the node's own reason. Not-found is left as it is: what
// was not found depends on the call.
func classifyNodeError(err error) error {
	for _, c := range nodeClasses {
		if errors.Is(err, c.node) {
			return fmt.Errorf("%w: %s", c.cluster, nodeapi.Message(err))
		}
	}
	return err
}
