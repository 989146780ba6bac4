package node

import (
	"maps"
	"testing"
	"time"
)

// TestDemandPeak: the peak is the most creates within any burstSpan of
// the window, across second (and bucket) boundaries; creates older than
// the window are forgotten, and a key with none left is gone.
func TestDemandPeak(t *testing.T) {
	d := newDemand()
	a, b := PoolKey{TemplateID: "a"}, PoolKey{SnapshotID: "s1"}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }
	for range 3 {
		d.record(a, at(0.5))
	}
	for range 4 {
		d.record(a, at(9.9)) // 9 s after the first: the same burst
	}
	for range 2 {
		d.record(a, at(10.2)) // 10 s after the first: a burst with the 4 only
	}
	d.record(b, at(1))
	if got := d.peak(a, at(11)); got != 7 {
		t.Errorf("peak of 3 then 4 within 10 s, then 2: %d, want 7 (3+4; 4+2 is 6)", got)
	}
	if got := d.peak(b, at(11)); got != 1 {
		t.Errorf("peak of another key: %d, want 1", got)
	}
	if got := d.peak(PoolKey{TemplateID: "none"}, at(11)); got != 0 {
		t.Errorf("peak of a key never created: %d", got)
	}
	// A clock stepping back counts in the latest second: 4 + 4.
	d.record(a, at(5))
	d.record(a, at(5))
	if got := d.peak(a, at(11)); got != 8 {
		t.Errorf("after creates with the clock stepped back: %d, want 8", got)
	}
	// The first second leaves the window: what is left is one burst.
	if got := d.peak(a, at(0.5).Add(demandWindow)); got != 8 {
		t.Errorf("with the first second out of the window: %d, want 8", got)
	}
	if keys := d.keys(at(2).Add(demandWindow)); len(keys) != 1 || keys[0] != a {
		t.Errorf("keys once b's create is out of the window: %v, want [a]", keys)
	}
	if got := d.peak(a, at(11).Add(demandWindow)); got != 0 {
		t.Errorf("peak once everything is out of the window: %d", got)
	}
	if len(d.seconds) != 0 {
		t.Errorf("keys kept with nothing in the window: %v", d.seconds)
	}
	d.record(a, at(1000))
	d.forget(a)
	if got := d.peak(a, at(1000)); got != 0 {
		t.Errorf("peak of a forgotten key: %d", got)
	}
}

// TestPoolTargets: floors come first, then peaks one sandbox at a time
// to the key furthest below its own, within the budget; a key too dear
// for what is left stops while a cheaper one grows; a key without demand
// keeps only its floor; memory pressure cuts what the pool holds by what
// the host is short of, floors included.
func TestPoolTargets(t *testing.T) {
	base, big, small, idle := PoolKey{TemplateID: "base"}, PoolKey{TemplateID: "big"}, PoolKey{TemplateID: "small"}, PoolKey{TemplateID: "idle"}
	const mib = 1 << 20
	for _, tc := range []struct {
		name               string
		wants              []poolWant
		budget, held, over int64
		want               map[PoolKey]int
	}{
		{"FloorsOnly", []poolWant{{Key: base, Floor: 2, CostBytes: 40 * mib}, {Key: idle, CostBytes: 40 * mib}},
			1024 * mib, 0, 0, map[PoolKey]int{base: 2, idle: 0}},
		{"PeakAboveFloor", []poolWant{{Key: base, Floor: 1, Peak: 8, CostBytes: 40 * mib}},
			1024 * mib, 0, 0, map[PoolKey]int{base: 8}},
		{"PeakBelowFloor", []poolWant{{Key: base, Floor: 3, Peak: 1, CostBytes: 40 * mib}},
			1024 * mib, 0, 0, map[PoolKey]int{base: 3}},
		// 400 MiB: base's floor (40), then one at a time to the key
		// furthest below its peak (the earlier on a tie) until the 400
		// MiB are spent.
		{"BudgetShared", []poolWant{{Key: base, Floor: 1, Peak: 10, CostBytes: 40 * mib}, {Key: big, Peak: 10, CostBytes: 40 * mib}},
			400 * mib, 0, 0, map[PoolKey]int{base: 5, big: 5}},
		{"CheaperFitsWhereDearerDoesNot", []poolWant{{Key: big, Peak: 10, CostBytes: 300 * mib}, {Key: small, Peak: 10, CostBytes: 20 * mib}},
			400 * mib, 0, 0, map[PoolKey]int{big: 1, small: 5}},
		{"Ceiling", []poolWant{{Key: base, Floor: 3, Peak: 10, Ceiling: 2, CostBytes: 40 * mib}, {Key: big, Peak: 4, Ceiling: 6, CostBytes: 40 * mib}},
			1024 * mib, 0, 0, map[PoolKey]int{base: 2, big: 4}},
		{"NoBudget", []poolWant{{Key: base, Floor: 2, Peak: 5, CostBytes: 40 * mib}},
			0, 0, 0, map[PoolKey]int{base: 0}},
		// Holding 5 x 40 MiB with the host 90 MiB short: 110 MiB left,
		// two sandboxes' worth; the floor of 3 is not kept.
		{"Pressure", []poolWant{{Key: base, Floor: 3, Peak: 5, CostBytes: 40 * mib}},
			1024 * mib, 200 * mib, 90 * mib, map[PoolKey]int{base: 2}},
		{"PressurePastThePool", []poolWant{{Key: base, Floor: 3, Peak: 5, CostBytes: 40 * mib}},
			1024 * mib, 200 * mib, 500 * mib, map[PoolKey]int{base: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := poolTargets(tc.wants, tc.budget, tc.held, tc.over)
			if !maps.Equal(got, tc.want) {
				t.Errorf("targets %v, want %v", got, tc.want)
			}
			var used int64
			for _, w := range tc.wants {
				used += int64(got[w.Key]) * w.CostBytes
			}
			if budget := max(0, min(tc.budget, tc.held-tc.over)); tc.over > 0 && used > budget || used > tc.budget {
				t.Errorf("targets take %d MiB of a %d MiB budget", used/mib, tc.budget/mib)
			}
		})
	}
}
