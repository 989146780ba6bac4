// Package state is the control plane's live state: sandbox records, build
// jobs, catalog pointers, node leases and the election that decides which
// server enforces deadlines. Everything that must outlive one process lives
// here, never in a map or a timer of one server.
//
// The implementation is etcd (see Open): embedded in `aenv server` as the
// single-host default, or an external cluster. NewMemory is an in-memory
// Store for unit tests only; both pass the one conformance suite in
// state/statetest. The control plane (cluster, buildjob, apikeys), what it
// shares with the node agents (membership) and the wiring import it; it
// imports nothing of the module's.
//
// Keys are plain strings ("sandboxes/<id>"); a Store puts them under its
// own prefix, so several aenv clusters may share one etcd. Values are
// opaque bytes (callers encode JSON). Every write returns the store's new
// revision; an Entry carries the revision that last modified it, which is
// what Update and Delete compare against:
//
//	rev, _ := st.Create(ctx, "sandboxes/abc", v1)    // fails with ErrExists if present
//	e, _ := st.Get(ctx, "sandboxes/abc")             // e.Revision == rev
//	_, err := st.Update(ctx, "sandboxes/abc", v2, e.Revision)
//	// err is ErrConflict if anyone wrote the key since Get
//
// Watch delivers every change under a prefix after a revision, in order,
// so a reader can List once and then follow changes without a gap.
package state

import (
	"context"
	"errors"
	"time"
)

// Error classes; implementations wrap them, callers test with errors.Is.
var (
	// ErrNotFound: the key does not exist.
	ErrNotFound = errors.New("state: key not found")
	// ErrExists: Create found the key already present.
	ErrExists = errors.New("state: key exists")
	// ErrConflict: the key's revision is not the one the caller read.
	ErrConflict = errors.New("state: revision conflict")
	// ErrUnavailable: the store cannot be reached (etcd down, no quorum).
	// The API maps it to 503; retrying later may succeed.
	ErrUnavailable = errors.New("state: store unavailable")
	// ErrCompacted: a watch asked for revisions that compaction removed;
	// the watcher must List again.
	ErrCompacted = errors.New("state: revision compacted")
	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("state: store closed")
	// ErrDenied: etcd's auth refused the caller (no user, or a user whose
	// roles do not grant the key); retrying does not help.
	ErrDenied = errors.New("state: permission denied")
)

// Entry is one key with its value.
type Entry struct {
	Key   string
	Value []byte
	// Revision is the store revision that last modified the key.
	Revision int64
	// Lease is the lease the key is bound to, or 0.
	Lease LeaseID
}

// LeaseID names a lease; keys written with it vanish when it expires.
type LeaseID int64

// WriteOptions tune a write.
type WriteOptions struct {
	// Lease binds the key to a lease: it is deleted when the lease ends.
	Lease LeaseID
}

// EventType says what happened to a key.
type EventType int

// Event types.
const (
	EventPut EventType = iota + 1
	EventDelete
)

// Event is one change seen by a watch. A Delete event's Entry has the key
// and the deleting revision but no value. An Event with Err set is the
// last one on its channel.
type Event struct {
	Type  EventType
	Entry Entry
	Err   error
}

// KV is the keyed, revisioned part of a Store.
type KV interface {
	// Get returns key's entry, or ErrNotFound.
	Get(ctx context.Context, key string) (Entry, error)
	// List returns every entry whose key starts with prefix, ordered by
	// key, and the store revision the list was read at (for Watch).
	List(ctx context.Context, prefix string) ([]Entry, int64, error)
	// Create writes key only if it does not exist (ErrExists otherwise).
	Create(ctx context.Context, key string, value []byte, opts WriteOptions) (int64, error)
	// Update writes key only if its revision is still rev (ErrConflict
	// otherwise; ErrNotFound if it is gone).
	Update(ctx context.Context, key string, value []byte, rev int64, opts WriteOptions) (int64, error)
	// Put writes key whatever it holds.
	Put(ctx context.Context, key string, value []byte, opts WriteOptions) (int64, error)
	// Delete removes key. With rev > 0 only if its revision is still rev
	// (ErrConflict otherwise). Deleting a missing key is ErrNotFound.
	Delete(ctx context.Context, key string, rev int64) error
}

// Watcher follows changes.
type Watcher interface {
	// Watch delivers, in revision order, every change to keys under prefix
	// made after revision afterRev (List's revision), until ctx ends or an
	// error (ErrCompacted, ErrClosed) ends the channel.
	Watch(ctx context.Context, prefix string, afterRev int64) <-chan Event
}

// Session is a lease kept alive in the background, as etcd's
// concurrency.Session: what a node or a leader holds to say it is alive.
type Session interface {
	// Lease is the session's lease, for WriteOptions.
	Lease() LeaseID
	// Done is closed when the lease is lost (expired, revoked, store gone).
	Done() <-chan struct{}
	// Close revokes the lease, deleting its keys.
	Close(ctx context.Context) error
}

// Leadership is held by the winner of an election until Done or Resign.
type Leadership interface {
	// Done is closed when leadership is lost.
	Done() <-chan struct{}
	// Resign gives leadership up so that another candidate wins at once.
	Resign(ctx context.Context) error
}

// Leases grant sessions and run elections.
type Leases interface {
	// NewSession grants a lease of ttl and keeps it alive until Close or
	// until ctx ends.
	NewSession(ctx context.Context, ttl time.Duration) (Session, error)
	// Campaign blocks until candidate leads election name (or ctx ends).
	// Leadership is bound to s: it ends when s does.
	Campaign(ctx context.Context, s Session, name, candidate string) (Leadership, error)
	// Evict ends every candidacy of candidate in election name, with the
	// sessions behind them: for a restarted process whose earlier self
	// died leading, so that it need not wait out that session's lease.
	// Only a candidate name unique to one process at a time may be evicted.
	Evict(ctx context.Context, name, candidate string) error
}

// Store is the whole live state.
type Store interface {
	KV
	Watcher
	Leases
	// Close releases the store (an embedded etcd stops).
	Close() error
}
