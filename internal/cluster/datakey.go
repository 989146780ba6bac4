package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// Resealed counts what ResealState rewrote.
type Resealed struct {
	Sandboxes, Volumes int
	// CA is 1 when the cluster CA's key was sealed again (0: the
	// cluster has no CA record yet).
	CA int
}

// ResealState rewrites every secret the store holds (the tokens of
// sandbox and volume records, the cluster CA's key, the data key check)
// sealed with keys' current key, so that older keys can be retired. It opens them with any
// of keys; each write is a compare-and-swap, retried on a concurrent
// change, so that running servers may go on meanwhile.
func ResealState(ctx context.Context, st state.Store, keys *sealed.Keyring) (Resealed, error) {
	var n Resealed
	err := reseal(ctx, st, sandboxPrefix, func(e state.Entry) ([]byte, error) {
		r, err := decodeRecord(keys, e)
		if err != nil {
			return nil, err
		}
		return encodeRecord(keys, &r)
	}, &n.Sandboxes)
	if err != nil {
		return n, err
	}
	err = reseal(ctx, st, volumePrefix, func(e state.Entry) ([]byte, error) {
		v, err := decodeVolume(keys, e.Value)
		if err != nil {
			return nil, fmt.Errorf("decoding %s: %w", e.Key, err)
		}
		return encodeVolume(keys, v)
	}, &n.Volumes)
	if err != nil {
		return n, err
	}
	// The CA's key too: a server holding only the new key (one that
	// joins, or every one once an old key is retired) opens it.
	err = reseal(ctx, st, membership.CAKey, func(e state.Entry) ([]byte, error) {
		return membership.ResealCA(keys, e.Value)
	}, &n.CA)
	if err != nil {
		return n, err
	}
	// The check last: a process it lets in opens everything before it.
	var checks int
	err = reseal(ctx, st, membership.DataKeyCheckKey, func(e state.Entry) ([]byte, error) {
		return membership.ResealDataKeyCheck(keys, e.Value)
	}, &checks)
	return n, err
}

// reseal rewrites every entry under prefix with redo, counting them.
func reseal(ctx context.Context, st state.Store, prefix string, redo func(state.Entry) ([]byte, error), count *int) error {
	entries, _, err := st.List(ctx, prefix)
	if err != nil {
		return fmt.Errorf("resealing %s: %w", prefix, err)
	}
	for _, e := range entries {
		for attempt := 0; ; attempt++ {
			b, err := redo(e)
			if err != nil {
				return fmt.Errorf("resealing %s: %w", e.Key, err)
			}
			_, err = st.Update(ctx, e.Key, b, e.Revision, state.WriteOptions{})
			if err == nil {
				*count++
				break
			}
			if errors.Is(err, state.ErrNotFound) {
				break // deleted meanwhile: nothing left to seal
			}
			if !errors.Is(err, state.ErrConflict) || attempt >= 20 {
				return fmt.Errorf("resealing %s: %w", e.Key, err)
			}
			if e, err = st.Get(ctx, e.Key); errors.Is(err, state.ErrNotFound) {
				break
			} else if err != nil {
				return fmt.Errorf("resealing %s: %w", e.Key, err)
			}
		}
	}
	return nil
}
