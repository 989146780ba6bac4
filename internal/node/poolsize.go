package node

import (
	"slices"
	"time"
)

// How the warm pool is sized. A pool is worth what the next burst of
// creates takes from it, and the best guess of the next burst is the
// largest recent one: a node remembers, per pool key, when each create
// came (to the second), and sizes the key's pool to the most creates of
// any burstSpan within demandWindow. A key nobody created within the
// window has a peak of 0, and its pool shrinks to its floor.
const (
	// burstSpan is how close together creates count as one burst: an RL
	// step's creates come within a few seconds.
	burstSpan = 10 * time.Second
	// demandWindow is how long a burst is remembered: long enough to span
	// the gap between two steps of a training loop, short enough that a
	// template nobody uses stops holding memory within minutes.
	demandWindow = 5 * time.Minute
)

// demand is the recent creates of each pool key. It is not safe for
// concurrent use (the pool holds its lock).
type demand struct {
	// seconds holds, per key, the creates of each second with any, in
	// order, none older than demandWindow (as of the last call).
	seconds map[PoolKey][]secondCount
}

type secondCount struct {
	at    int64 // Unix seconds
	count int
}

func newDemand() *demand { return &demand{seconds: map[PoolKey][]secondCount{}} }

// record counts one create of key at now.
func (d *demand) record(key PoolKey, now time.Time) {
	s := now.Unix()
	list := d.seconds[key]
	if n := len(list); n > 0 && list[n-1].at >= s {
		// A clock that stepped back counts in the latest second.
		list[n-1].count++
	} else {
		list = append(list, secondCount{at: s, count: 1})
	}
	d.seconds[key] = list
}

// peak is the most creates of key within any burstSpan of the last
// demandWindow, as of now; it forgets what is older.
func (d *demand) peak(key PoolKey, now time.Time) int {
	list := d.prune(key, now)
	span := int64(burstSpan / time.Second)
	best, sum, lo := 0, 0, 0
	for _, sc := range list {
		sum += sc.count
		for sc.at-list[lo].at >= span {
			sum -= list[lo].count
			lo++
		}
		best = max(best, sum)
	}
	return best
}

// prune drops key's creates older than demandWindow, and the key once it
// has none.
func (d *demand) prune(key PoolKey, now time.Time) []secondCount {
	list := d.seconds[key]
	cut := now.Add(-demandWindow).Unix()
	i := 0
	for i < len(list) && list[i].at <= cut {
		i++
	}
	if i == len(list) {
		delete(d.seconds, key)
		return nil
	}
	list = list[i:]
	d.seconds[key] = list
	return list
}

// keys are the keys with creates within the window, as of now.
func (d *demand) keys(now time.Time) []PoolKey {
	var out []PoolKey
	for k := range d.seconds {
		if d.prune(k, now) != nil {
			out = append(out, k)
		}
	}
	return out
}

// forget drops key's creates (its template or snapshot is gone).
func (d *demand) forget(key PoolKey) { delete(d.seconds, key) }

// poolWant is what one key asks of the pool's memory budget.
type poolWant struct {
	Key PoolKey
	// Peak is the key's recent burst (demand.peak), Floor what it keeps
	// prestarted whatever the demand (the base template's --warm-pool),
	// Ceiling the most it may keep (0: no bound but the budget's).
	Peak, Floor, Ceiling int
	// CostBytes is the host memory one prestarted sandbox of the key
	// takes: measured on the ones it has, else an estimate.
	CostBytes int64
}

// poolTargets sizes each key's pool within budgetBytes of host memory:
// every floor first, in the order given, then one sandbox at a time to
// the key furthest below its peak (the earlier one on a tie), while one
// more fits. A key whose next sandbox does not fit stops growing; a
// cheaper one may still grow. With the host's memory above the node's
// high-water mark by overBytes, the budget is cut to what the pool holds
// now (heldBytes) less that excess, so that the pool gives back at most
// what the host is short of, floors included. A ceiling bounds a key's
// floor and peak alike.
func poolTargets(wants []poolWant, budgetBytes, heldBytes, overBytes int64) map[PoolKey]int {
	if overBytes > 0 {
		budgetBytes = min(budgetBytes, heldBytes-overBytes)
	}
	targets := make(map[PoolKey]int, len(wants))
	left := budgetBytes
	fits := func(w poolWant) bool { return w.CostBytes <= left }
	wants = slices.Clone(wants)
	for i, w := range wants {
		if w.Ceiling > 0 {
			wants[i].Floor, wants[i].Peak = min(w.Floor, w.Ceiling), min(w.Peak, w.Ceiling)
		}
	}
	for _, w := range wants {
		targets[w.Key] = 0
		for targets[w.Key] < w.Floor && fits(w) {
			targets[w.Key]++
			left -= w.CostBytes
		}
	}
	open := wants
	for {
		best := -1
		for i, w := range open {
			if w.Peak-targets[w.Key] <= 0 || !fits(w) {
				continue
			}
			if best < 0 || w.Peak-targets[w.Key] > open[best].Peak-targets[open[best].Key] {
				best = i
			}
		}
		if best < 0 {
			return targets
		}
		targets[open[best].Key]++
		left -= open[best].CostBytes
	}
}
