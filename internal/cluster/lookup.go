package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/aenvhq/aenv/internal/state"
)

// lookupTimeout bounds the store read behind a route lookup. A healthy
// etcd answers in a millisecond; a slow or partitioned one must not pile
// up proxied requests, and their goroutines, behind it.
const lookupTimeout = 2 * time.Second

// unknownFor is how long an id the store has no record of is answered as
// unknown without asking the store again, and maxUnknown how many such ids
// are kept (the oldest go first; one costs ~150 bytes, so 10,000 are
// ~1.5 MiB).
//
// The negative answer is not invalidated when a record arrives: it needs
// no invalidating, because Route reads the records cache first, so a
// record the watch brings (another server's create, milliseconds after its
// write) is routed at once whatever this holds. unknownFor is kept short
// for the one case that remains, a watch that lags (a reload after
// compaction, an overloaded etcd): a sandbox is then hidden from this
// server for at most that long, and only from a client that asked for its
// id before its record existed.
const (
	unknownFor = 2 * time.Second
	maxUnknown = 10_000
)

// unknownIDs remembers for a moment the ids the store said it has no
// record of, so that a client repeating one (a poller of a sandbox that is
// gone, a script sending junk) costs no store read each time. It is safe
// for concurrent use.
type unknownIDs struct {
	mu  sync.Mutex
	ids *simplelru.LRU[string, time.Time] // when the store said so
}

func newUnknownIDs(size int) *unknownIDs {
	l, err := simplelru.NewLRU[string, time.Time](size, nil)
	if err != nil {
		panic(fmt.Sprintf("making the unknown-id cache: %v", err)) // only for size <= 0
	}
	return &unknownIDs{ids: l}
}

// has reports whether the store said id is unknown less than unknownFor
// before now.
func (u *unknownIDs) has(id string, now time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.ids.Peek(id)
	if ok && now.Sub(at) >= unknownFor {
		u.ids.Remove(id)
		return false
	}
	return ok
}

// add records that the store has no record of id at now, evicting the
// oldest entry when full.
func (u *unknownIDs) add(id string, now time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.ids.Add(id, now)
}

// lookup reads the record of id, which the cache does not hold, from the
// store, for Route: within lookupTimeout, and answering ids the store just
// said it lacks without asking again. Its ErrNotFound does not say why a
// sandbox is gone: the proxy does not tell, and that would be a second
// read per unknown id.
func (rs *records) lookup(ctx context.Context, id string) (record, error) {
	if rs.unknown.has(id, time.Now()) {
		return record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	r, _, err := rs.fetch(ctx, id)
	if errors.Is(err, state.ErrNotFound) {
		rs.unknown.add(id, time.Now())
		return record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err != nil {
		return record{}, fmt.Errorf("looking up sandbox %s: %w", id, err)
	}
	return r, nil
}

// RouteCached reports whether Route answers id from memory, without a
// store read: its record is cached, or the store said a moment ago that it
// has none. The API limits per client the lookups that are not.
func (c *Cluster) RouteCached(id string) bool {
	if _, _, _, _, ok := c.recs.route(id); ok {
		return true
	}
	return c.recs.unknown.has(id, time.Now())
}
