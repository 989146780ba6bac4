package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// A team's running-sandbox quota must hold across servers: two servers
// racing for the last slot may not both win. Counting each server's cache
// cannot promise that (a create on another server reaches the cache
// milliseconds later), so a team with a bound keeps its starts in flight
// in one record, team-slots/<team>, changed only by compare-and-swap (an
// etcd transaction on its revision). A start counts from the moment its
// reservation is stored until its record runs, where every cache counts
// it; a reservation whose sandbox runs, paused or is gone is pruned by the
// next start that sees so, and one left by a server that died ends after
// slotInFlight.
const slotsPrefix = "team-slots/"

// slotInFlight bounds how long a reservation counts without its sandbox
// running: far longer than a start takes, and no longer than records
// remember deletions (goneFor), which prunes reservations of sandboxes
// killed at once.
const slotInFlight = goneFor

// slots is a team's starts in flight: sandbox id to when it was reserved.
type slots struct {
	InFlight map[string]time.Time `json:"inFlight"`
}

// teamLimits returns team's bounds.
func (c *Cluster) teamLimits(team string) TeamLimits {
	if c.cfg.TeamLimits == nil || team == "" {
		return TeamLimits{}
	}
	return c.cfg.TeamLimits(team)
}

// reserveRunning takes running slots of team for the sandboxes ids are
// about to start (or resume) as, or fails with ErrQuota naming the limit
// and the count. done(started) ends the reservation: one that failed is
// given back at once; one that started is left for the record to count.
func (c *Cluster) reserveRunning(ctx context.Context, team string, ids ...string) (done func(started bool), err error) {
	max := c.teamLimits(team).MaxSandboxes
	if max <= 0 {
		return func(bool) {}, nil
	}
	key := slotsPrefix + team
	for attempt := 0; attempt < 50; attempt++ {
		cur, rev, err := c.readSlots(ctx, key)
		if err != nil {
			return nil, err
		}
		running := c.pruneSlots(team, &cur)
		if running+len(ids) > max {
			return nil, fmt.Errorf("%w: team %s runs %d of its %d sandboxes (counting starts in flight); asked for %d more",
				ErrQuota, team, running, max, len(ids))
		}
		now := time.Now().UTC()
		for _, id := range ids {
			cur.InFlight[id] = now
		}
		if err := c.writeSlots(ctx, key, cur, rev); errors.Is(err, state.ErrConflict) || errors.Is(err, state.ErrExists) {
			continue // another start changed them: count again
		} else if err != nil {
			return nil, err
		}
		return func(started bool) {
			if !started {
				c.releaseSlots(context.WithoutCancel(ctx), team, ids)
			}
		}, nil
	}
	return nil, fmt.Errorf("%w: reserving a sandbox slot of team %s: too many starts at once; try again", ErrUnavailable, team)
}

// pruneSlots drops the reservations the cache accounts for and returns
// the team's running sandboxes plus its starts still in flight.
func (c *Cluster) pruneSlots(team string, cur *slots) int {
	running := map[string]bool{}
	busy := map[string]bool{}
	c.recs.each(func(r *record) {
		if r.TeamID() != team {
			return
		}
		switch {
		case r.State == StateRunning:
			running[r.ID] = true
		case r.Op != "":
			busy[r.ID] = true // paused, being resumed
		}
	})
	n := len(running)
	for id, at := range cur.InFlight {
		switch {
		case running[id]:
			delete(cur.InFlight, id) // counted by every cache by now
		case busy[id] && time.Since(at) < staleOp:
			n++
		case c.recs.has(id) || c.recs.deletedRecently(id) || time.Since(at) > slotInFlight:
			delete(cur.InFlight, id) // paused, gone, or left by a server that died
		default:
			n++
		}
	}
	return n
}

// renameSlot moves a reservation made before its sandbox had an id to
// that id, so that it is pruned once the record runs, like any other.
func (c *Cluster) renameSlot(ctx context.Context, team, from, to string) {
	if c.teamLimits(team).MaxSandboxes <= 0 {
		return
	}
	key := slotsPrefix + team
	for range 20 {
		cur, rev, err := c.readSlots(ctx, key)
		if err != nil {
			break
		}
		at, ok := cur.InFlight[from]
		if !ok {
			return
		}
		delete(cur.InFlight, from)
		cur.InFlight[to] = at
		if err = c.writeSlots(ctx, key, cur, rev); !errors.Is(err, state.ErrConflict) {
			if err == nil {
				return
			}
			break
		}
	}
	c.log.Warn("renaming a sandbox slot; it expires on its own", "team", team, "sandbox_id", to)
}

// releaseSlots gives back the reservations of starts that failed.
func (c *Cluster) releaseSlots(ctx context.Context, team string, ids []string) {
	key := slotsPrefix + team
	for range 20 {
		cur, rev, err := c.readSlots(ctx, key)
		if err == nil {
			for _, id := range ids {
				delete(cur.InFlight, id)
			}
			if err = c.writeSlots(ctx, key, cur, rev); !errors.Is(err, state.ErrConflict) {
				if err != nil {
					c.log.Warn("giving back sandbox slots; they expire on their own", "team", team, "err", err)
				}
				return
			}
		}
	}
}

func (c *Cluster) readSlots(ctx context.Context, key string) (slots, int64, error) {
	cur := slots{InFlight: map[string]time.Time{}}
	e, err := c.cfg.State.Get(ctx, key)
	if errors.Is(err, state.ErrNotFound) {
		return cur, 0, nil
	}
	if err != nil {
		return cur, 0, fmt.Errorf("reading %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value, &cur); err != nil || cur.InFlight == nil {
		cur.InFlight = map[string]time.Time{} // unreadable: start afresh
	}
	return cur, e.Revision, nil
}

func (c *Cluster) writeSlots(ctx context.Context, key string, cur slots, rev int64) error {
	b, _ := json.Marshal(cur)
	var err error
	if rev == 0 {
		_, err = c.cfg.State.Create(ctx, key, b, state.WriteOptions{})
	} else {
		_, err = c.cfg.State.Update(ctx, key, b, rev, state.WriteOptions{})
	}
	if err != nil && !errors.Is(err, state.ErrConflict) && !errors.Is(err, state.ErrExists) {
		return fmt.Errorf("writing %s: %w", key, err)
	}
	return err
}

// withinPausedQuota refuses to pause one more sandbox of team past its
// bound on paused sandboxes. It counts the cache: two pauses at once on
// two servers may overshoot by one, which costs storage, not isolation.
func (c *Cluster) withinPausedQuota(team string) error {
	max := c.teamLimits(team).MaxPaused
	if max <= 0 {
		return nil
	}
	n := 0
	c.recs.each(func(r *record) {
		if r.TeamID() == team && r.State == StatePaused {
			n++
		}
	})
	if n+1 > max {
		return fmt.Errorf("%w: team %s keeps %d of its %d paused sandboxes; kill some, or resume them", ErrQuota, team, n, max)
	}
	return nil
}

// Usage is what a team has now.
type Usage struct {
	Running int `json:"running"`
	Paused  int `json:"paused"`
}

// TeamUsage counts team's sandboxes.
func (c *Cluster) TeamUsage(team string) Usage {
	var u Usage
	c.recs.each(func(r *record) {
		if r.TeamID() != team {
			return
		}
		if r.State == StateRunning {
			u.Running++
		} else {
			u.Paused++
		}
	})
	return u
}
