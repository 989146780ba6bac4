package membership

import (
	"context"
	"errors"
	"fmt"

	"github.com/aenvhq/aenv/internal/state"
)

// stoppingMark is the drain mark of a node that drains itself as it stops
// (operators' marks hold a time).
const stoppingMark = "on-stop"

// MarkStopping marks node id draining because it is stopping: placement
// skips it at once. ClearStopping, at its next start, removes that mark
// (and only that one: an operator's drain outlives restarts).
func MarkStopping(ctx context.Context, st state.Store, id string) error {
	if _, err := st.Put(ctx, DrainPrefix+id, []byte(stoppingMark), state.WriteOptions{}); err != nil {
		return fmt.Errorf("marking node %s draining: %w", id, err)
	}
	return nil
}

// ClearStopping removes the mark MarkStopping left.
func ClearStopping(ctx context.Context, st state.Store, id string) error {
	e, err := st.Get(ctx, DrainPrefix+id)
	if errors.Is(err, state.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading node %s's drain mark: %w", id, err)
	}
	if string(e.Value) != stoppingMark {
		return nil
	}
	if err := st.Delete(ctx, DrainPrefix+id, e.Revision); err != nil && !errors.Is(err, state.ErrNotFound) && !errors.Is(err, state.ErrConflict) {
		return fmt.Errorf("clearing node %s's drain mark: %w", id, err)
	}
	return nil
}
