package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// RemovedPrefix marks the nodes an operator removed (`aenv node rm`): the
// value is the time of the removal. A certificate of such a node issued
// at or before that time is refused by every server and is not renewed;
// a node that joins again later with a new join token gets a new one.
const RemovedPrefix = "cluster/removed-nodes/"

// RemoveNode marks node id removed at now and takes it out of the live
// registry.
func RemoveNode(ctx context.Context, st state.Store, id string, now time.Time) error {
	if _, err := st.Put(ctx, RemovedPrefix+id, []byte(now.UTC().Format(time.RFC3339Nano)), state.WriteOptions{}); err != nil {
		return fmt.Errorf("removing node %s: %w", id, err)
	}
	return DeregisterNode(ctx, st, id)
}

// Removals is the set of removed nodes, followed from the state. It is
// safe for concurrent use.
type Removals struct {
	mu      sync.RWMutex
	removed map[string]time.Time
	onAdd   func(id string)
	cancel  context.CancelFunc
	done    chan struct{}
}

// WatchRemovals reads the removed nodes and follows them until Close;
// onRemove (optional) is called with each node removed from then on.
func WatchRemovals(ctx context.Context, st state.Store, onRemove func(id string), log *slog.Logger) (*Removals, error) {
	ents, rev, err := st.List(ctx, RemovedPrefix)
	if err != nil {
		return nil, fmt.Errorf("reading the removed nodes: %w", err)
	}
	r := &Removals{removed: map[string]time.Time{}, onAdd: onRemove, done: make(chan struct{})}
	for _, e := range ents {
		r.apply(state.Event{Type: state.EventPut, Entry: e})
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	go func() {
		defer close(r.done)
		for bg.Err() == nil {
			for ev := range st.Watch(bg, RemovedPrefix, rev) {
				if ev.Err != nil {
					if bg.Err() == nil {
						log.Warn("following the removed nodes", "err", ev.Err)
					}
					break
				}
				rev = ev.Entry.Revision
				r.apply(ev)
			}
			if bg.Err() != nil {
				return
			}
			// A broken or compacted watch: read them all again.
			sleepCtx(bg, time.Second)
			if ents, rev2, err := st.List(bg, RemovedPrefix); err == nil {
				for _, e := range ents {
					r.apply(state.Event{Type: state.EventPut, Entry: e})
				}
				rev = rev2
			}
		}
	}()
	return r, nil
}

func (r *Removals) apply(ev state.Event) {
	id := strings.TrimPrefix(ev.Entry.Key, RemovedPrefix)
	r.mu.Lock()
	_, had := r.removed[id]
	if ev.Type == state.EventDelete {
		delete(r.removed, id)
	} else if t, err := time.Parse(time.RFC3339Nano, string(ev.Entry.Value)); err == nil {
		r.removed[id] = t
	}
	_, has := r.removed[id]
	r.mu.Unlock()
	if has && !had && r.onAdd != nil {
		r.onAdd(id)
	}
}

// Refused reports whether a certificate of node id issued at issued is
// refused: the node was removed then or later. Certificates carry times
// in whole seconds, so one issued in the second of the removal is
// refused too.
func (r *Removals) Refused(id string, issued time.Time) bool {
	r.mu.RLock()
	at, ok := r.removed[id]
	r.mu.RUnlock()
	return ok && !issued.After(at.Truncate(time.Second))
}

// Close stops following.
func (r *Removals) Close() {
	r.cancel()
	<-r.done
}

// ErrNodeRemoved: the node was removed from the cluster.
var ErrNodeRemoved = errors.New("node removed")
