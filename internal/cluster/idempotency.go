package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// idempotencyPrefix holds one key per Idempotency-Key a create was sent
// with, naming the sandbox that create made (or is making). Servers share
// it, so a retry that reaches another server finds it too.
const idempotencyPrefix = "idempotency/"

// IdempotencyTTL is how long a create's Idempotency-Key is remembered.
const IdempotencyTTL = 24 * time.Hour

// idempotencyWait bounds how long a retry waits for the create it repeats
// to finish (a create's own time, a restore included).
const idempotencyWait = 2 * time.Minute

// ErrIdempotencyConflict: an Idempotency-Key whose create failed or whose
// sandbox is gone.
var ErrIdempotencyConflict = errors.New("idempotency key already used")

type idempotencyRecord struct {
	SandboxID string    `json:"sandboxID"`
	At        time.Time `json:"at"`
	// Created is set once the sandbox exists: a retry that then finds
	// no sandbox need not wait for one.
	Created bool `json:"created,omitempty"`
}

// idempotencyKey is where key of owner is recorded: hashed, since a
// client's key may be anything, and scoped to the API key, so that two
// users' retries never meet.
func idempotencyKey(owner Owner, key string) string {
	sum := sha256.Sum256([]byte(key))
	scope := owner.KeyID
	if scope == "" {
		scope = "_"
	}
	return idempotencyPrefix + scope + "/" + hex.EncodeToString(sum[:16])
}

// reserveIdempotent records that the create with key makes sandbox id.
// When a create with that key came first, it returns that create's
// sandbox (waiting for it to be made), or ErrIdempotencyConflict.
func (c *Cluster) reserveIdempotent(ctx context.Context, owner Owner, key, id string) (*Sandbox, error) {
	k := idempotencyKey(owner, key)
	b, _ := json.Marshal(idempotencyRecord{SandboxID: id, At: time.Now().UTC()})
	_, err := c.cfg.State.Create(ctx, k, b, state.WriteOptions{})
	if err == nil {
		return nil, nil
	}
	if !errors.Is(err, state.ErrExists) {
		return nil, fmt.Errorf("recording idempotency key: %w", err)
	}
	e, err := c.cfg.State.Get(ctx, k)
	if err != nil {
		return nil, fmt.Errorf("reading idempotency key: %w", err)
	}
	var rec idempotencyRecord
	if err := json.Unmarshal(e.Value, &rec); err != nil {
		return nil, fmt.Errorf("reading idempotency key: %w", err)
	}
	deadline := rec.At.Add(idempotencyWait)
	for {
		sb, err := c.Get(ctx, rec.SandboxID)
		if err == nil {
			c.log.Info("create repeated with the same Idempotency-Key: the first create's sandbox", "sandbox_id", rec.SandboxID)
			return sb, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		// The first create is still running, or it failed (its key is
		// then removed), or its sandbox has ended.
		e, gerr := c.cfg.State.Get(ctx, k)
		if gerr == nil {
			json.Unmarshal(e.Value, &rec)
		}
		if gerr == nil && rec.Created {
			// Made between the look above and this read: look again
			// before calling it gone.
			if sb, err := c.Get(ctx, rec.SandboxID); err == nil {
				c.log.Info("create repeated with the same Idempotency-Key: the first create's sandbox", "sandbox_id", rec.SandboxID)
				return sb, nil
			}
		}
		if errors.Is(gerr, state.ErrNotFound) || rec.Created || time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: the create it was first sent with made sandbox %s, which is gone or failed (%v)",
				ErrIdempotencyConflict, rec.SandboxID, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// createdIdempotent marks key's sandbox as made.
func (c *Cluster) createdIdempotent(ctx context.Context, owner Owner, key, id string) {
	b, _ := json.Marshal(idempotencyRecord{SandboxID: id, At: time.Now().UTC(), Created: true})
	if _, err := c.cfg.State.Put(ctx, idempotencyKey(owner, key), b, state.WriteOptions{}); err != nil {
		c.log.Warn("recording an idempotent create's sandbox", "sandbox_id", id, "err", err)
	}
}

// releaseIdempotent forgets key after its create failed, so that the
// client's next retry creates afresh.
func (c *Cluster) releaseIdempotent(ctx context.Context, owner Owner, key string) {
	if err := c.cfg.State.Delete(ctx, idempotencyKey(owner, key), 0); err != nil && !errors.Is(err, state.ErrNotFound) {
		c.log.Warn("removing idempotency key of a failed create", "err", err)
	}
}

// sweepIdempotency forgets keys older than IdempotencyTTL.
func (c *Cluster) sweepIdempotency(ctx context.Context) {
	entries, _, err := c.cfg.State.List(ctx, idempotencyPrefix)
	if err != nil {
		c.log.Warn("listing idempotency keys", "err", err)
		return
	}
	for _, e := range entries {
		var rec idempotencyRecord
		if json.Unmarshal(e.Value, &rec) == nil && time.Since(rec.At) < IdempotencyTTL {
			continue
		}
		if err := c.cfg.State.Delete(ctx, e.Key, e.Revision); err != nil && !errors.Is(err, state.ErrNotFound) && !errors.Is(err, state.ErrConflict) {
			c.log.Warn("removing an expired idempotency key", "err", err)
		}
	}
}
