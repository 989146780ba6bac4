package node

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// What a node keeps of the sandboxes that left it, by default: an hour,
// within 512 MiB, a quarter of it for any one team. A sandbox's history is
// at most a day of samples and two thousand log lines (some hundreds of
// KiB, compressed a tenth of that); a sandbox of an RL run that lived
// seconds leaves about a KiB.
const (
	DefaultEndedHistoryRetention = time.Hour
	DefaultEndedHistoryBytes     = 512 << 20
	defaultTeamShare             = 4
)

// EndedHistory bounds what a node keeps of ended sandboxes' histories.
type EndedHistory struct {
	// Dir keeps them, one compressed file each, so that the heap holds
	// only an index entry per ended sandbox (empty: in memory, compressed,
	// within the same bounds).
	Dir string
	// Retention is how long a history outlives its sandbox (0:
	// DefaultEndedHistoryRetention).
	Retention time.Duration
	// MaxBytes bounds all of them, MaxTeamBytes those of one team, in
	// bytes compressed and, on disk, rounded up to whole 4 KiB blocks;
	// the oldest go first. 0: DefaultEndedHistoryBytes,
	// and a quarter of MaxBytes for a team.
	MaxBytes, MaxTeamBytes int64
}

// endedRecord is a history as kept once its sandbox left: the node's
// samples and events, and envd's process events.
type endedRecord struct {
	ID     string     `json:"id"`
	Team   string     `json:"team,omitempty"`
	Ended  time.Time  `json:"ended"`
	Fine   []Sample   `json:"fine,omitempty"`
	Coarse []Sample   `json:"coarse,omitempty"`
	Logs   []LogEntry `json:"logs,omitempty"`
	Envd   []LogEntry `json:"envd,omitempty"`
}

// endedEntry is the index entry of one kept history.
type endedEntry struct {
	id, team string
	ended    time.Time
	size     int64
	// data is the history itself when the store has no directory.
	data []byte
	// gone marks an entry removed while still queued.
	gone bool
}

// endedStore keeps the histories of ended sandboxes, oldest evicted first
// when the node's or a team's bytes run over, and each dropped at its
// retention. It is safe for concurrent use.
type endedStore struct {
	cfg EndedHistory
	log *slog.Logger
	now func() time.Time

	mu    sync.Mutex
	byID  map[string]*endedEntry
	order fifo // every entry, by when it ended
	teams map[string]*teamEntries
	bytes int64
}

type teamEntries struct {
	q     fifo
	bytes int64
}

// fifo is a queue of entries, oldest first, removed ones skipped lazily.
type fifo struct {
	items []*endedEntry
	head  int
}

func (f *fifo) push(e *endedEntry) { f.items = append(f.items, e) }

// front returns the oldest entry still kept, nil when none.
func (f *fifo) front() *endedEntry {
	for f.head < len(f.items) && f.items[f.head].gone {
		f.items[f.head] = nil
		f.head++
	}
	// The queue's array is reused, not grown, once most of it is past.
	if f.head > 64 && f.head*2 > len(f.items) {
		f.items = slices.Clip(append(f.items[:0], f.items[f.head:]...))
		f.head = 0
	}
	if f.head == len(f.items) {
		return nil
	}
	return f.items[f.head]
}

func (f *fifo) len() int { return len(f.items) - f.head }

func newEndedStore(cfg EndedHistory, log *slog.Logger, now func() time.Time) (*endedStore, error) {
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultEndedHistoryRetention
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultEndedHistoryBytes
	}
	if cfg.MaxTeamBytes <= 0 {
		cfg.MaxTeamBytes = cfg.MaxBytes / defaultTeamShare
	}
	s := &endedStore{cfg: cfg, log: log, now: now, byID: map[string]*endedEntry{}, teams: map[string]*teamEntries{}}
	if cfg.Dir == "" {
		return s, nil
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the ended sandboxes' history directory: %w", err)
	}
	return s, s.load()
}

// teamDir is where team's histories are: a directory per team, named by
// the team's hex (a team id is any string), so that the index is rebuilt
// at start from names and file times alone.
func (s *endedStore) teamDir(team string) string {
	return filepath.Join(s.cfg.Dir, "t"+hex.EncodeToString([]byte(team)))
}

func (s *endedStore) path(e *endedEntry) string {
	return filepath.Join(s.teamDir(e.team), e.id+".json.gz")
}

// load indexes the histories an earlier process of this node kept, and
// drops those past their retention or the bounds.
func (s *endedStore) load() error {
	dirs, err := os.ReadDir(s.cfg.Dir)
	if err != nil {
		return fmt.Errorf("reading the ended sandboxes' history directory: %w", err)
	}
	var found []*endedEntry
	for _, d := range dirs {
		team, err := hex.DecodeString(strings.TrimPrefix(d.Name(), "t"))
		if !d.IsDir() || !strings.HasPrefix(d.Name(), "t") || err != nil {
			os.RemoveAll(filepath.Join(s.cfg.Dir, d.Name()))
			continue
		}
		files, _ := os.ReadDir(filepath.Join(s.cfg.Dir, d.Name()))
		for _, f := range files {
			id, ok := strings.CutSuffix(f.Name(), ".json.gz")
			fi, err := f.Info()
			if !ok || !fileName(id) || err != nil || !fi.Mode().IsRegular() {
				// A write cut short, or not ours.
				os.Remove(filepath.Join(s.cfg.Dir, d.Name(), f.Name()))
				continue
			}
			found = append(found, &endedEntry{id: id, team: string(team), ended: fi.ModTime(), size: diskSize(fi.Size())})
		}
	}
	slices.SortFunc(found, func(a, b *endedEntry) int { return a.ended.Compare(b.ended) })
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range found {
		s.index(e)
		s.evictLocked(e.team)
	}
	for _, d := range dirs {
		os.Remove(filepath.Join(s.cfg.Dir, d.Name())) // those left empty
	}
	return nil
}

// index adds e, the newest entry, to the index.
func (s *endedStore) index(e *endedEntry) {
	if old := s.byID[e.id]; old != nil {
		// Its file was just written over, unless it was another team's.
		s.dropLocked(old, old.team != e.team)
	}
	s.byID[e.id] = e
	s.order.push(e)
	t := s.teams[e.team]
	if t == nil {
		t = &teamEntries{}
		s.teams[e.team] = t
	}
	t.q.push(e)
	t.bytes += e.size
	s.bytes += e.size
}

// put keeps r, replacing what was kept of the same sandbox.
func (s *endedStore) put(r *endedRecord) error {
	if !fileName(r.ID) {
		return fmt.Errorf("keeping the history of sandbox %q: not an id", r.ID)
	}
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestSpeed)
	if err := json.NewEncoder(zw).Encode(r); err != nil {
		return fmt.Errorf("keeping the history of sandbox %s: %w", r.ID, err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("keeping the history of sandbox %s: %w", r.ID, err)
	}
	e := &endedEntry{id: r.ID, team: r.Team, ended: r.Ended, size: int64(buf.Len())}
	if s.cfg.Dir == "" {
		e.data = buf.Bytes()
	} else {
		e.size = diskSize(e.size)
		if err := s.write(e, buf.Bytes()); err != nil {
			return fmt.Errorf("keeping the history of sandbox %s: %w", r.ID, err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.index(e)
	s.evictLocked(e.team)
	return nil
}

// write stores e's file whole or not at all (a crash leaves a .tmp file
// that load removes); its time is when the sandbox ended.
func (s *endedStore) write(e *endedEntry, data []byte) error {
	p := s.path(e)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(p+".tmp", data, 0o600); err != nil {
		os.Remove(p + ".tmp")
		return err
	}
	if err := os.Chtimes(p+".tmp", e.ended, e.ended); err != nil {
		os.Remove(p + ".tmp")
		return err
	}
	return os.Rename(p+".tmp", p)
}

// get returns what is kept of sandbox id, or ok false.
func (s *endedStore) get(id string) (_ *endedRecord, ok bool, err error) {
	s.mu.Lock()
	e := s.byID[id]
	expired := e != nil && s.now().Sub(e.ended) > s.cfg.Retention
	s.mu.Unlock()
	if e == nil || expired {
		return nil, false, nil
	}
	data := e.data
	if data == nil {
		if data, err = os.ReadFile(s.path(e)); errors.Is(err, os.ErrNotExist) {
			return nil, false, nil // evicted meanwhile
		} else if err != nil {
			return nil, false, fmt.Errorf("reading the history of sandbox %s: %w", id, err)
		}
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return nil, false, fmt.Errorf("reading the history of sandbox %s: %w", id, err)
	}
	var r endedRecord
	if err := json.NewDecoder(zr).Decode(&r); err != nil && !errors.Is(err, io.EOF) {
		return nil, false, fmt.Errorf("reading the history of sandbox %s: %w", id, err)
	}
	return &r, true, nil
}

// remove drops what is kept of sandbox id (it runs here again).
func (s *endedStore) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.byID[id]; e != nil {
		s.dropLocked(e, true)
	}
}

// sweep drops the histories past their retention.
func (s *endedStore) sweep() {
	s.mu.Lock()
	defer s.mu.Unlock()
	cut := s.now().Add(-s.cfg.Retention)
	for e := s.order.front(); e != nil && e.ended.Before(cut); e = s.order.front() {
		s.dropLocked(e, true)
	}
}

// evictLocked drops team's oldest histories while it is over its bound,
// then the oldest of all while the node is over its own.
func (s *endedStore) evictLocked(team string) {
	for t := s.teams[team]; t != nil && t.bytes > s.cfg.MaxTeamBytes; t = s.teams[team] {
		e := t.q.front()
		if e == nil {
			break
		}
		s.dropLocked(e, true)
	}
	for s.bytes > s.cfg.MaxBytes {
		e := s.order.front()
		if e == nil {
			break
		}
		s.dropLocked(e, true)
	}
}

// dropLocked removes e from the index, and its file with it if asked.
func (s *endedStore) dropLocked(e *endedEntry, file bool) {
	if e.gone {
		return
	}
	e.gone = true
	if s.byID[e.id] == e {
		delete(s.byID, e.id)
	}
	s.bytes -= e.size
	if t := s.teams[e.team]; t != nil {
		t.bytes -= e.size
		if t.q.front() == nil {
			delete(s.teams, e.team)
		}
	}
	s.order.front() // let the queue shed what is gone at its head
	e.data = nil
	if file && s.cfg.Dir != "" {
		// A team's directory stays (a put may be writing into it) until
		// the next start.
		if err := os.Remove(s.path(e)); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Warn("removing an ended sandbox's history", "sandbox_id", e.id, "err", err)
		}
	}
}

// has reports whether a history of sandbox id is kept (maybe past its
// retention, until the next sweep).
func (s *endedStore) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id] != nil
}

// usage returns the bytes kept, all told and of team, and how many
// histories.
func (s *endedStore) usage(team string) (all, ofTeam int64, count int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.teams[team]; t != nil {
		ofTeam = t.bytes
	}
	return s.bytes, ofTeam, len(s.byID)
}

// fileName reports whether id names a file of its own in a directory.
func fileName(id string) bool {
	return id != "" && id != "." && id != ".." && filepath.Base(id) == id && !strings.ContainsAny(id, `/\`)
}

// diskBlock is what a small file takes on the disk at least: a sandbox
// of an RL run leaves a history of less than a KiB, which the bounds
// count as the block it takes.
const diskBlock = 4 << 10

func diskSize(n int64) int64 { return (n + diskBlock - 1) / diskBlock * diskBlock }
