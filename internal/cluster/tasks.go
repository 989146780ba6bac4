package cluster

import (
	"context"
	"sync"
)

// tasks owns the cluster's background goroutines: each runs under a
// context that close cancels, and close waits for every one. Once close
// has begun Go starts nothing more, so that no goroutine joins a wait
// already under way (which sync.WaitGroup forbids, and which a node event
// arriving during Close would otherwise do).
type tasks struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// newTasks returns an owner whose context carries parent's values, not
// its end: background work lasts until close, not until the call that
// opened the cluster returns.
func newTasks(parent context.Context) *tasks {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	return &tasks{ctx: ctx, cancel: cancel}
}

// Go runs fn in a goroutine of its own with the owner's context, unless
// close has begun; it reports whether it did.
func (t *tasks) Go(fn func(ctx context.Context)) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		fn(t.ctx)
	}()
	return true
}

// close refuses new tasks, cancels the context of the running ones and
// waits for them to return.
func (t *tasks) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.cancel()
	t.wg.Wait()
}

// join makes a call the caller runs itself (a migration) one of the
// owner's tasks: the context it returns ends with ctx or at close, and
// close waits for done, so that what the call does to undo itself when
// cancelled is finished before close returns. ok is false once close has
// begun.
func (t *tasks) join(ctx context.Context) (_ context.Context, done func(), ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ctx, func() {}, false
	}
	t.wg.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(t.ctx, cancel)
	return ctx, func() {
		stop()
		cancel()
		t.wg.Done()
	}, true
}
