package cluster

import (
	"fmt"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/nodeapi"
)

// classifyNodeError puts a node API error into the cluster's error
// classes, keeping the node's own reason. Not-found is left as it is: what
// was not found depends on the call.
func classifyNodeError(err error) error {
	var class error
	switch nodeapi.Code(err) {
	case connect.CodeInvalidArgument:
		class = ErrInvalid
	case connect.CodeResourceExhausted:
		class = ErrNoCapacity
	case connect.CodeFailedPrecondition, connect.CodeAlreadyExists:
		class = ErrConflict
	case connect.CodeUnimplemented:
		class = ErrUnsupported
	case connect.CodeUnavailable:
		class = ErrUnavailable
	default:
		return err
	}
	return fmt.Errorf("%w: %s", class, nodeapi.Message(err))
}
