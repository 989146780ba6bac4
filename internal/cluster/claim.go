package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// claim marks a sandbox in state want busy with op, in the store, so that
// no other operation (from this server or another) interleaves; release
// clears the mark. A mark older than staleOp is taken over.
func (c *Cluster) claim(ctx context.Context, id string, want State, op string) (record, error) {
	return c.recs.mutate(ctx, id, func(r *record) error {
		if r.Op != "" && time.Since(r.OpSince) < staleOp {
			return fmt.Errorf("%w: sandbox %s is busy (%s in progress)", ErrConflict, id, r.Op)
		}
		if r.State != want {
			return fmt.Errorf("%w: sandbox %s is %s", ErrConflict, id, r.State)
		}
		r.Op, r.OpSince = op, time.Now().UTC()
		return nil
	})
}

func (c *Cluster) release(ctx context.Context, id, op string) {
	_, err := c.recs.mutate(context.WithoutCancel(ctx), id, func(r *record) error {
		if r.Op != op {
			return errUnchanged
		}
		r.clearOp()
		return nil
	})
	if err != nil && !errors.Is(err, ErrNotFound) {
		c.log.Warn("clearing operation mark", "sandbox_id", id, "op", op, "err", err)
	}
}
