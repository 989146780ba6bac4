package cluster

import (
	"errors"
	"fmt"

	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/template"
)

func isTemplateNotFound(err error) bool { return errors.Is(err, template.ErrNotFound) }

// classifyNodeError puts a node's admission refusals into the cluster's
// error classes, keeping the node's reason.
func classifyNodeError(err error) error {
	switch {
	case errors.Is(err, node.ErrTooLarge):
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	case errors.Is(err, node.ErrNoCapacity):
		return fmt.Errorf("%w: %w", ErrNoCapacity, err)
	}
	return err
}
