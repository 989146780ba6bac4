package state

import (
	"context"
	"time"
)

// Follow calls apply with every change under prefix after rev until ctx
// ends: the way to keep a cache of a prefix current after listing it.
// When the watch breaks (the store down, its history compacted past rev)
// Follow starts over from load's fresh list, which returns the revision
// to go on from, after a pause so that a store that is down is not
// hammered. onErr hears every failure.
func Follow(ctx context.Context, st Watcher, prefix string, rev int64,
	load func(context.Context) (int64, error), apply func(Event), onErr func(error)) {
	for ctx.Err() == nil {
		for ev := range st.Watch(ctx, prefix, rev) {
			if ev.Err != nil {
				if ctx.Err() == nil {
					onErr(ev.Err)
				}
				break
			}
			apply(ev)
			rev = ev.Entry.Revision
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		if r, err := load(ctx); err == nil {
			rev = r
		} else if ctx.Err() == nil {
			onErr(err)
		}
	}
}
