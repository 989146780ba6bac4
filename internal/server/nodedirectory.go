package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/state"
)

// nodeDirectory follows the live registry for what the transports need
// to reach a node: whether it serves mutual TLS, and which node an
// address is (the proxy forwards to an address). It is safe for
// concurrent use.
type nodeDirectory struct {
	st     state.Store
	mu     sync.RWMutex
	byID   map[string]membership.NodeInfo
	cancel context.CancelFunc
	done   chan struct{}
}

func watchNodes(ctx context.Context, st state.Store, log *slog.Logger) (*nodeDirectory, error) {
	d := &nodeDirectory{st: st, byID: map[string]membership.NodeInfo{}, done: make(chan struct{})}
	rev, err := d.load(ctx)
	if err != nil {
		return nil, err
	}
	bg, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.cancel = cancel
	go func() {
		defer close(d.done)
		for bg.Err() == nil {
			for ev := range st.Watch(bg, membership.LivePrefix, rev) {
				if ev.Err != nil {
					if bg.Err() == nil {
						log.Warn("following the node registry", "err", ev.Err)
					}
					break
				}
				rev = ev.Entry.Revision
				d.apply(ev)
			}
			select {
			case <-bg.Done():
				return
			case <-time.After(time.Second):
			}
			if r, err := d.load(bg); err == nil {
				rev = r
			}
		}
	}()
	return d, nil
}

func (d *nodeDirectory) load(ctx context.Context) (int64, error) {
	ents, rev, err := d.st.List(ctx, membership.LivePrefix)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		d.apply(state.Event{Type: state.EventPut, Entry: e})
	}
	return rev, nil
}

func (d *nodeDirectory) apply(ev state.Event) {
	id := strings.TrimPrefix(ev.Entry.Key, membership.LivePrefix)
	d.mu.Lock()
	defer d.mu.Unlock()
	if ev.Type == state.EventDelete {
		delete(d.byID, id)
		return
	}
	var n membership.NodeInfo
	if json.Unmarshal(ev.Entry.Value, &n) == nil {
		d.byID[id] = n
	}
}

// tls reports whether node id serves mutual TLS. A node the watch has not
// shown yet (the cluster dialled it on the same event) is read from the
// registry.
func (d *nodeDirectory) tls(ctx context.Context, id string) bool {
	d.mu.RLock()
	n, ok := d.byID[id]
	d.mu.RUnlock()
	if ok {
		return n.TLS
	}
	e, err := d.st.Get(ctx, membership.LivePrefix+id)
	if err != nil {
		return false
	}
	d.apply(state.Event{Type: state.EventPut, Entry: e})
	_ = json.Unmarshal(e.Value, &n)
	return n.TLS
}

// at is the live node registered at address, if any.
func (d *nodeDirectory) at(address string) (membership.NodeInfo, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, n := range d.byID {
		if n.Address == address {
			return n, true
		}
	}
	return membership.NodeInfo{}, false
}

func (d *nodeDirectory) close() {
	d.cancel()
	<-d.done
}
