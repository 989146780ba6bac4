package node

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestActivityObserve(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var a activity
	a.restart(at(0))
	a.observe(at(5), 100, true, 0, false, 5) // the first reading is a baseline
	if !a.at.Equal(at(0)) {
		t.Fatalf("a first packet count moved the activity to %v", a.at)
	}
	a.observe(at(10), 100, true, 1, true, 5)
	if !a.at.Equal(at(0)) {
		t.Fatalf("no traffic and 1%% CPU moved the activity to %v", a.at)
	}
	a.observe(at(15), 101, true, 0, true, 5)
	if !a.at.Equal(at(15)) {
		t.Fatalf("a packet did not count as activity: %v", a.at)
	}
	a.observe(at(20), 101, true, 5, true, 5)
	if !a.at.Equal(at(20)) {
		t.Fatalf("CPU at the busy mark did not count as activity: %v", a.at)
	}
	a.observe(at(25), 0, false, 0, true, 5)
	if !a.at.Equal(at(25)) {
		t.Fatalf("an unreadable count did not count as activity: %v", a.at)
	}
	a.observe(at(30), 7, true, 0, true, 5) // a baseline again after the gap
	a.observe(at(35), 7, true, 0, true, 5)
	if !a.at.Equal(at(25)) {
		t.Fatalf("a quiet sandbox moved its activity to %v", a.at)
	}
	a.reported = at(35)
	a.restart(at(40))
	if !a.at.Equal(at(40)) || a.known || !a.reported.IsZero() {
		t.Fatalf("restart left %+v", a)
	}
}

func TestIdleReports(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	quiet := func(id string, d time.Duration) idleCandidate {
		return idleCandidate{id: id, activity: activity{at: now.Add(-d)}}
	}
	ids := func(rs []Idle) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return strings.Join(out, ",")
	}
	cands := []idleCandidate{quiet("busy", time.Second), quiet("quiet", 11*time.Minute), quiet("quieter", 20*time.Minute),
		quiet("mild", 2*time.Minute)}

	if got := idleReports(IdlePolicy{}, cands, 0.99, 0.9, now); len(got) != 0 {
		t.Fatalf("the zero policy reported %v", ids(got))
	}
	got := idleReports(IdlePolicy{After: 10 * time.Minute}, cands, 0.99, 0.9, now)
	if ids(got) != "quiet,quieter" {
		t.Fatalf("10m policy reported %q, want quiet,quieter", ids(got))
	}
	if got[0].Pressure || !strings.Contains(got[0].Reason, "under 5% CPU for 11m0s") {
		t.Fatalf("idle report %+v", got[0])
	}

	// A sandbox reported less than idleResend ago is not reported again.
	again := append([]idleCandidate(nil), cands...)
	again[1].activity.reported = now.Add(-30 * time.Second)
	again[2].activity.reported = now.Add(-2 * time.Minute)
	if got := idleReports(IdlePolicy{After: 10 * time.Minute}, again, 0, 0.9, now); ids(got) != "quieter" {
		t.Fatalf("with quiet reported 30 s ago: %q, want quieter", ids(got))
	}

	// Under pressure: the idlest not reported already, quiet for
	// pressureQuiet at least; nothing below the mark.
	p := IdlePolicy{UnderPressure: true, CPUPercent: 2}
	if got := idleReports(p, cands, 0.5, 0.9, now); len(got) != 0 {
		t.Fatalf("no pressure reported %v", ids(got))
	}
	if got := idleReports(p, cands, -1, 0.9, now); len(got) != 0 {
		t.Fatalf("unknown memory use reported %v", ids(got))
	}
	got = idleReports(p, cands, 0.95, 0.9, now)
	if ids(got) != "quieter" || !got[0].Pressure || !strings.Contains(got[0].Reason, "95% used, above the 90%") {
		t.Fatalf("under pressure: %+v, want quieter", got)
	}
	p.After = 15 * time.Minute
	if got := idleReports(p, cands, 0.95, 0.9, now); ids(got) != "quieter,quiet" || got[0].Pressure || !got[1].Pressure {
		t.Fatalf("idle and pressure: %+v, want quieter (idle) then quiet (pressure)", got)
	}
	if got := idleReports(IdlePolicy{UnderPressure: true}, []idleCandidate{quiet("fresh", 10*time.Second)}, 0.95, 0.9, now); len(got) != 0 {
		t.Fatalf("pressure reported a sandbox quiet for 10 s: %v", ids(got))
	}
}

// TestNodeReportsIdle drives the sampling loop's part: a sandbox with no
// traffic and no CPU is reported once its quiet period passed (and not
// again at once), one with traffic or CPU is not until it goes quiet, a
// killed one no more.
func TestNodeReportsIdle(t *testing.T) {
	h := newHost(t)
	cfg := h.config()
	cfg.Idle = IdlePolicy{After: 300 * time.Millisecond}
	n, _ := h.start(cfg)
	var mu sync.Mutex
	var got []Idle
	n.OnIdle(func(i Idle) {
		mu.Lock()
		got = append(got, i)
		mu.Unlock()
	})
	reported := func() map[string]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string]int{}
		for _, i := range got {
			out[i.ID]++
		}
		return out
	}
	ctx := context.Background()
	var slots = map[string]string{}
	for _, id := range []string{"quiet", "talks", "works"} {
		sb, err := n.Create(ctx, CreateRequest{SandboxID: id, TemplateID: testTemplate})
		if err != nil {
			t.Fatal(err)
		}
		slots[id] = sb.slot.Name
	}
	h.net.set(func(f *fakeNetwork) { f.packets = map[string]uint64{} })
	n.sampleAll(ctx) // baselines
	for range 4 {
		time.Sleep(100 * time.Millisecond)
		h.net.set(func(f *fakeNetwork) { f.packets[slots["talks"]] += 3 })
		h.rt.set(func(r *fakeRuntime) {
			if r.cpu == nil {
				r.cpu = map[string]time.Duration{}
			}
			r.cpu["works"] += 50 * time.Millisecond // half a CPU
		})
		n.sampleAll(ctx)
	}
	if r := reported(); r["quiet"] != 1 || r["talks"] != 0 || r["works"] != 0 {
		t.Fatalf("after 400 ms: reported %v, want quiet once", r)
	}
	if err := n.Kill(ctx, "quiet"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(350 * time.Millisecond)
	n.sampleAll(ctx)
	if r := reported(); r["quiet"] != 1 || r["talks"] != 1 || r["works"] != 1 {
		t.Fatalf("after they all went quiet: reported %v, want each once (quiet killed)", r)
	}
}

// TestNodeReportsIdlestUnderPressure: above the high-water mark the node
// reports its idlest sandbox, one per sample, and none below it.
func TestNodeReportsIdlestUnderPressure(t *testing.T) {
	h := newHost(t)
	cfg := h.config()
	cfg.Capacity.MemoryHighWater = 0.9
	cfg.Idle = IdlePolicy{UnderPressure: true}
	n, _ := h.start(cfg)
	var got []Idle
	n.OnIdle(func(i Idle) { got = append(got, i) })
	ctx := context.Background()
	now := time.Now()
	for i, id := range []string{"recent", "older", "oldest"} {
		if _, err := n.Create(ctx, CreateRequest{SandboxID: id, TemplateID: testTemplate}); err != nil {
			t.Fatal(err)
		}
		n.hist.mu.Lock()
		n.hist.by[id].active.at = now.Add(-time.Duration(i*i) * time.Minute)
		n.hist.mu.Unlock()
	}
	n.reportIdle(n.List(), now)
	if len(got) != 0 {
		t.Fatalf("at 10%% memory: reported %+v", got)
	}
	h.load.set(func(l *fakeLoad) { l.used = 0.95 })
	n.reportIdle(n.List(), now)
	n.reportIdle(n.List(), now.Add(time.Second))
	if len(got) != 2 || got[0].ID != "oldest" || !got[0].Pressure || got[1].ID != "older" {
		t.Fatalf("at 95%% memory, two samples: reported %+v, want oldest then older", got)
	}
}
