package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// storeClock is a settable clock for the ended store.
type storeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *storeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *storeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newTestStore(t *testing.T, cfg EndedHistory) (*endedStore, *storeClock) {
	t.Helper()
	clock := &storeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	s, err := newEndedStore(cfg, slog.New(slog.DiscardHandler), clock.now)
	if err != nil {
		t.Fatal(err)
	}
	return s, clock
}

// endedOf is the record of a sandbox that ran a few seconds and ended at.
func endedOf(id, team string, at time.Time, lines int) *endedRecord {
	r := &endedRecord{ID: id, Team: team, Ended: at}
	for i := range lines {
		// Lines that do not compress to nothing: each names its sandbox
		// and number.
		r.Logs = append(r.Logs, LogEntry{At: at.Add(time.Duration(i-lines) * time.Millisecond), Level: "info",
			Message: fmt.Sprintf("line %d of %s", i, id), Fields: map[string]string{"n": fmt.Sprint(i * 7919 % 1000003)}})
	}
	r.Fine = []Sample{{At: at.Add(-time.Second), CPUUsedPct: 12.5, CPUCount: 1, MemUsed: 42 << 20, MemTotal: 512 << 20}}
	return r
}

func mustGet(t *testing.T, s *endedStore, id string) *endedRecord {
	t.Helper()
	r, ok, err := s.get(id)
	if err != nil || !ok {
		t.Fatalf("reading the history of %s: ok %v, %v", id, ok, err)
	}
	return r
}

func wantGone(t *testing.T, s *endedStore, id, why string) {
	t.Helper()
	if _, ok, err := s.get(id); ok || err != nil {
		t.Fatalf("the history of %s is kept %s (err %v)", id, why, err)
	}
}

// countFiles counts the histories on disk under dir.
func countFiles(t *testing.T, dir string) int {
	t.Helper()
	n := 0
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".json.gz") {
			n++
		}
		return nil
	})
	return n
}

// TestEndedStoreSpillsToDiskAndReadsBack: a history put is on disk, not in
// the heap, reads back whole, and is found again by the next process.
func TestEndedStoreSpillsToDiskAndReadsBack(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ended-history")
	s, clock := newTestStore(t, EndedHistory{Dir: dir})
	want := endedOf("sb-a", "team/one", clock.now(), 30)
	want.Envd = []LogEntry{{At: clock.now().Add(-time.Minute), Level: "info", Message: "process started", Fields: map[string]string{"pid": "7"}}}
	if err := s.put(want); err != nil {
		t.Fatal(err)
	}
	if e := s.byID["sb-a"]; e == nil || e.data != nil || e.size <= 0 {
		t.Fatalf("the index entry %+v: want one of some bytes, with its data on disk", e)
	}
	if n := countFiles(t, dir); n != 1 {
		t.Fatalf("%d files under %s, want 1", n, dir)
	}
	got := mustGet(t, s, "sb-a")
	if got.Team != "team/one" || !got.Ended.Equal(want.Ended) || len(got.Logs) != 30 || got.Logs[29].Message != want.Logs[29].Message ||
		len(got.Envd) != 1 || got.Envd[0].Fields["pid"] != "7" || len(got.Fine) != 1 || got.Fine[0].MemUsed != 42<<20 {
		t.Fatalf("read back %+v", got)
	}
	// A restart: the next process of the node indexes what is on disk.
	again, err := newEndedStore(EndedHistory{Dir: dir}, slog.New(slog.DiscardHandler), clock.now)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, again, "sb-a"); len(got.Logs) != 30 || got.Team != "team/one" {
		t.Fatalf("after a restart, read back %+v", got)
	}
	if all, team, n := again.usage("team/one"); n != 1 || all != team || all != s.byID["sb-a"].size {
		t.Fatalf("after a restart: %d bytes, %d of the team, %d histories; want the one of %d bytes", all, team, n, s.byID["sb-a"].size)
	}
	// Started here again: its history leaves the store.
	again.remove("sb-a")
	wantGone(t, again, "sb-a", "after it was removed")
	if n := countFiles(t, dir); n != 0 {
		t.Fatalf("%d files left after the remove", n)
	}
}

// TestEndedStoreTimeBound: a history goes at its retention, and its file
// with it.
func TestEndedStoreTimeBound(t *testing.T) {
	dir := t.TempDir()
	s, clock := newTestStore(t, EndedHistory{Dir: dir, Retention: 10 * time.Minute})
	if err := s.put(endedOf("sb-old", "t1", clock.now(), 3)); err != nil {
		t.Fatal(err)
	}
	clock.add(6 * time.Minute)
	if err := s.put(endedOf("sb-new", "t1", clock.now(), 3)); err != nil {
		t.Fatal(err)
	}
	clock.add(5 * time.Minute)
	// Past its retention it no longer answers, swept or not.
	wantGone(t, s, "sb-old", "past its retention")
	mustGet(t, s, "sb-new")
	s.sweep()
	if _, _, n := s.usage("t1"); n != 1 || countFiles(t, dir) != 1 {
		t.Fatalf("after the sweep: %d histories, %d files; want only sb-new's", n, countFiles(t, dir))
	}
	clock.add(6 * time.Minute)
	s.sweep()
	wantGone(t, s, "sb-new", "past its retention")
	if all, _, n := s.usage("t1"); n != 0 || all != 0 || countFiles(t, dir) != 0 {
		t.Fatalf("after the last sweep: %d histories of %d bytes, %d files; want none", n, all, countFiles(t, dir))
	}
	// What the next process finds past its retention goes too.
	if err := s.put(endedOf("sb-left", "t1", clock.now(), 3)); err != nil {
		t.Fatal(err)
	}
	clock.add(11 * time.Minute)
	again, err := newEndedStore(EndedHistory{Dir: dir, Retention: 10 * time.Minute}, slog.New(slog.DiscardHandler), clock.now)
	if err != nil {
		t.Fatal(err)
	}
	again.sweep()
	if countFiles(t, dir) != 0 {
		t.Fatalf("a history left by an earlier process outlived its retention")
	}
}

// TestEndedStoreBytesBound: past the node's bound the oldest histories go
// first, whatever their team, and the bytes kept stay within it.
func TestEndedStoreBytesBound(t *testing.T) {
	for _, dir := range []string{"", t.TempDir()} {
		t.Run(map[bool]string{true: "InMemory", false: "OnDisk"}[dir == ""], func(t *testing.T) {
			s, clock := newTestStore(t, EndedHistory{Dir: dir})
			if err := s.put(endedOf("probe", "t0", clock.now(), 200)); err != nil {
				t.Fatal(err)
			}
			size := s.byID["probe"].size
			s.remove("probe")
			// Room for ten, each team for all of them.
			s.cfg.MaxBytes, s.cfg.MaxTeamBytes = 10*size+size/2, 100*size
			for i := range 100 {
				clock.add(time.Second)
				if err := s.put(endedOf(fmt.Sprintf("sb-%03d", i), fmt.Sprint("t", i%3), clock.now(), 200)); err != nil {
					t.Fatal(err)
				}
				if all, _, _ := s.usage(""); all > s.cfg.MaxBytes {
					t.Fatalf("after %d puts, %d bytes kept, over the bound of %d", i+1, all, s.cfg.MaxBytes)
				}
			}
			all, _, n := s.usage("")
			if n < 8 || n > 10 {
				t.Fatalf("%d histories (%d bytes) kept, want about ten of %d bytes", n, all, size)
			}
			for i := range 100 - n {
				wantGone(t, s, fmt.Sprintf("sb-%03d", i), "older than the ten newest")
			}
			for i := 100 - n; i < 100; i++ {
				mustGet(t, s, fmt.Sprintf("sb-%03d", i))
			}
			if dir != "" && countFiles(t, dir) != n {
				t.Fatalf("%d files for %d histories", countFiles(t, dir), n)
			}
			// The queue behind the index does not grow with what went.
			if len(s.order.items) > 2*n+64 {
				t.Fatalf("the queue holds %d entries for %d histories", len(s.order.items), n)
			}
		})
	}
}

// TestEndedStoreTeamBound: a team past its share loses its own oldest
// histories, not another team's.
func TestEndedStoreTeamBound(t *testing.T) {
	dir := t.TempDir()
	s, clock := newTestStore(t, EndedHistory{Dir: dir})
	if err := s.put(endedOf("probe", "quiet", clock.now(), 200)); err != nil {
		t.Fatal(err)
	}
	size := s.byID["probe"].size
	s.remove("probe")
	s.cfg.MaxBytes, s.cfg.MaxTeamBytes = 100*size, 5*size+size/2
	for i := range 3 {
		if err := s.put(endedOf(fmt.Sprint("quiet-", i), "quiet", clock.now(), 200)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		clock.add(time.Second)
		if err := s.put(endedOf(fmt.Sprintf("busy-%02d", i), "busy", clock.now(), 200)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 3 {
		mustGet(t, s, fmt.Sprint("quiet-", i))
	}
	_, busy, _ := s.usage("busy")
	_, quiet, _ := s.usage("quiet")
	if busy > s.cfg.MaxTeamBytes || busy < 3*size || quiet < 3*size-size/4 {
		t.Fatalf("busy keeps %d bytes (bound %d), quiet %d; want busy at its bound and quiet's three (%d each)", busy, s.cfg.MaxTeamBytes, quiet, size)
	}
	wantGone(t, s, "busy-00", "past its team's share")
	mustGet(t, s, "busy-49")
	if n := countFiles(t, filepath.Join(dir, s.teamDir("busy")[len(dir):])); n > 5 {
		t.Fatalf("%d files of the busy team on disk, want at most 5", n)
	}
}

// TestEndedHistoryLeavesTheHeap: a killed sandbox's history is no longer
// in the node's memory, and its log and metrics still answer, from disk;
// a sandbox started again where it ran before takes its history back.
func TestEndedHistoryLeavesTheHeap(t *testing.T) {
	h := newHost(t)
	cfg := h.config()
	cfg.EndedHistory.Dir = filepath.Join(t.TempDir(), "ended-history")
	n, _ := h.start(cfg)
	ctx := context.Background()
	for i := range 20 {
		id := fmt.Sprint("sb", i)
		if _, err := n.Create(ctx, CreateRequest{SandboxID: id, TemplateID: testTemplate, TeamID: "team-" + fmt.Sprint(i%2)}); err != nil {
			t.Fatal(err)
		}
		if err := n.Kill(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	n.hist.mu.Lock()
	inMemory := len(n.hist.by)
	n.hist.mu.Unlock()
	if inMemory != 0 {
		t.Fatalf("%d histories of killed sandboxes are in memory, want none", inMemory)
	}
	if c := countFiles(t, cfg.EndedHistory.Dir); c != 20 {
		t.Fatalf("%d histories on disk, want 20", c)
	}
	logs, err := n.Logs("sb7")
	if err != nil || len(logs) < 2 || logs[len(logs)-1].Message != "sandbox killed" {
		t.Fatalf("the log of a killed sandbox: %+v, %v; want its creation and its kill", logs, err)
	}
	if m, err := n.Metrics("sb7"); err != nil || len(m) == 0 {
		t.Fatalf("the metrics of a killed sandbox: %+v, %v; want its first sample", m, err)
	}
	if _, team1, _ := n.hist.ended.usage("team-1"); team1 <= 0 {
		t.Fatalf("team-1 keeps %d bytes of history, want its ten sandboxes'", team1)
	}
	if _, err := n.Logs("never-ran"); err == nil {
		t.Fatal("the log of a sandbox that never ran here: no error")
	}
	// Run here again (a resume): the history goes on from where it was.
	n.historyStarted("sb7", "team-1", time.Time{})
	n.logEvent("sb7", "info", "sandbox restored")
	if n.hist.ended.has("sb7") {
		t.Fatal("a sandbox running again still has its history in the ended store")
	}
	logs, _ = n.Logs("sb7")
	if len(logs) < 3 || logs[0].Message != "sandbox created" || logs[len(logs)-1].Message != "sandbox restored" {
		t.Fatalf("the log of a sandbox started again: %+v", logs)
	}
}

// TestOrphanHistoriesEnd: an event recorded for a sandbox that is not
// running (one that came as it went) does not keep a history in memory
// for good.
func TestOrphanHistoriesEnd(t *testing.T) {
	h := newHost(t)
	n, _ := h.start(h.config())
	n.logEvent("gone", "warn", "egress refused")
	now := time.Now()
	n.sweepHistories(nil, now)
	n.sweepHistories(nil, now.Add(orphanAfter/2))
	n.hist.mu.Lock()
	_, kept := n.hist.by["gone"]
	n.hist.mu.Unlock()
	if !kept {
		t.Fatal("a history was ended before orphanAfter")
	}
	n.sweepHistories(nil, now.Add(orphanAfter+time.Second))
	n.hist.mu.Lock()
	left := len(n.hist.by)
	n.hist.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d histories in memory after orphanAfter, want none", left)
	}
	if logs, err := n.Logs("gone"); err != nil || len(logs) != 1 {
		t.Fatalf("the orphan's log: %+v, %v; want its one event, kept as ended", logs, err)
	}
}
