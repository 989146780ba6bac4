package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// Keys in the state store.
const (
	sandboxPrefix   = "sandboxes/"
	tombstonePrefix = "tombstones/"
)

// tombstoneTTL is how long a lost sandbox's id keeps answering with the
// reason it is gone (the SDKs know only running and paused).
const tombstoneTTL = 24 * time.Hour

// record is the cluster's working copy of a sandbox's entry in the state
// store: the Sandbox plus the operation in progress on it. Op doubles as
// the lock that keeps two pauses, resumes or snapshots from interleaving,
// across servers too. What the store holds is its storedRecord.
type record struct {
	Sandbox
	// Op is the state change in progress ("pause", "resume", "snapshot",
	// "fork"), empty when none.
	Op string
	// OpSince is when Op began; an Op older than staleOp is taken to be
	// left by a server that died (restart recovery clears its own).
	OpSince time.Time
}

// recordSchema is the version of storedRecord this server writes.
// Versions: 0 (no "schema"): the API's Sandbox as it was, with a clientID
// and without secure or privateTraffic; 1: this struct.
const recordSchema = 1

// storedRecord is a sandbox's record as the state store holds it: the
// store's schema, apart from the API's Sandbox so that either can change
// without the other; every server of a cluster, old and new, reads it.
// Its field names are those version 0 had, so a record written before
// the schema had a version decodes as it is.
type storedRecord struct {
	Schema             int               `json:"schema,omitempty"`
	ID                 string            `json:"id"`
	TemplateID         string            `json:"templateID"`
	Alias              string            `json:"alias,omitempty"`
	NodeID             string            `json:"nodeID"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	State              State             `json:"state"`
	StartedAt          time.Time         `json:"startedAt"`
	EndAt              time.Time         `json:"endAt"`
	CPUCount           int               `json:"cpuCount"`
	MemoryMB           int               `json:"memoryMB"`
	DiskMB             int               `json:"diskMB"`
	EnvdVersion        string            `json:"envdVersion"`
	EnvdAccessToken    string            `json:"envdAccessToken,omitempty"`
	AutoPause          bool              `json:"autoPause,omitempty"`
	AutoPauseFilesOnly bool              `json:"autoPauseFilesOnly,omitempty"`
	AutoResume         bool              `json:"autoResume,omitempty"`
	Timeout            time.Duration     `json:"timeout,omitempty"`
	Addr               netip.Addr        `json:"addr,omitzero"`
	SnapshotID         string            `json:"snapshotID,omitempty"`
	PausedAt           time.Time         `json:"pausedAt,omitzero"`
	IdlePaused         bool              `json:"idlePaused,omitempty"`
	AllowInternet      bool              `json:"allowInternet,omitempty"`
	AllowOut           []string          `json:"allowOut,omitempty"`
	DenyOut            []string          `json:"denyOut,omitempty"`
	MaskRequestHost    string            `json:"maskRequestHost,omitempty"`
	KeyID              string            `json:"keyID,omitempty"`
	Team               string            `json:"team,omitempty"`
	Mounts             []storedMount     `json:"mounts,omitempty"`
	TrafficAccessToken string            `json:"trafficAccessToken,omitempty"`
	// Secure and PrivateTraffic are from schema 1; a version 0 record's
	// are read off its tokens.
	Secure         bool      `json:"secure,omitempty"`
	PrivateTraffic bool      `json:"privateTraffic,omitempty"`
	Op             string    `json:"op,omitempty"`
	OpSince        time.Time `json:"opSince,omitzero"`
}

// storedMount is a VolumeMount in a storedRecord.
type storedMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	VolumeID string `json:"volumeID,omitempty"`
}

// toStored is r as the store keeps it (tokens as they are: the caller
// seals them).
func toStored(r *record) storedRecord {
	s := storedRecord{
		Schema: recordSchema, ID: r.ID, TemplateID: r.TemplateID, Alias: r.Alias, NodeID: r.NodeID,
		Metadata: r.Metadata, State: r.State, StartedAt: r.StartedAt, EndAt: r.EndAt,
		CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskMB: r.DiskMB,
		EnvdVersion: r.EnvdVersion, EnvdAccessToken: r.EnvdAccessToken,
		AutoPause: r.AutoPause, AutoPauseFilesOnly: r.AutoPauseFilesOnly, AutoResume: r.AutoResume,
		Timeout: r.Timeout, Addr: r.Addr, SnapshotID: r.SnapshotID, PausedAt: r.PausedAt, IdlePaused: r.IdlePaused,
		AllowInternet: r.AllowInternet, AllowOut: r.Network.AllowOut, DenyOut: r.Network.DenyOut,
		MaskRequestHost: r.Network.MaskRequestHost, KeyID: r.KeyID, Team: r.Team,
		TrafficAccessToken: r.TrafficAccessToken, Secure: r.Secure, PrivateTraffic: r.PrivateTraffic,
		Op: r.Op, OpSince: r.OpSince,
	}
	for _, m := range r.Mounts {
		s.Mounts = append(s.Mounts, storedMount(m))
	}
	return s
}

// fromStored is the record s holds, of whichever schema.
func fromStored(s *storedRecord) record {
	r := record{Sandbox: Sandbox{
		Spec: Spec{
			Metadata: s.Metadata, Timeout: s.Timeout,
			AutoPause: s.AutoPause, AutoPauseFilesOnly: s.AutoPauseFilesOnly, AutoResume: s.AutoResume,
			CPUCount: s.CPUCount, MemoryMB: s.MemoryMB, AllowInternet: s.AllowInternet,
			Network:        NetworkRules{AllowOut: s.AllowOut, DenyOut: s.DenyOut, MaskRequestHost: s.MaskRequestHost},
			PrivateTraffic: s.PrivateTraffic, Secure: s.Secure,
		},
		ID: s.ID, TemplateID: s.TemplateID, Alias: s.Alias, NodeID: s.NodeID, State: s.State,
		StartedAt: s.StartedAt, EndAt: s.EndAt, DiskMB: s.DiskMB,
		EnvdVersion: s.EnvdVersion, EnvdAccessToken: s.EnvdAccessToken,
		Addr: s.Addr, SnapshotID: s.SnapshotID, PausedAt: s.PausedAt, IdlePaused: s.IdlePaused,
		KeyID: s.KeyID, Team: s.Team, TrafficAccessToken: s.TrafficAccessToken,
	}, Op: s.Op, OpSince: s.OpSince}
	for _, m := range s.Mounts {
		r.Mounts = append(r.Mounts, VolumeMount(m))
	}
	if s.Schema == 0 {
		// Version 0 kept the settings only as the tokens they made.
		r.PrivateTraffic = s.TrafficAccessToken != ""
		r.Secure = s.EnvdAccessToken != ""
	}
	return r
}

// staleOp is how long an operation may hold a sandbox before another
// server may take it: far longer than a pause of the largest sandbox.
const staleOp = 15 * time.Minute

// clearOp ends the operation mark.
func (r *record) clearOp() { r.Op, r.OpSince = "", time.Time{} }

// tombstone says why a sandbox id is gone, if it died, and whose it was:
// its logs and metrics outlive its record, and only its team may read
// them.
type tombstone struct {
	Reason string    `json:"reason"`
	Team   string    `json:"team,omitempty"`
	At     time.Time `json:"at"`
	// Until is when it goes (zero, in tombstones from before it: At
	// plus tombstoneTTL).
	Until time.Time `json:"until,omitzero"`
}

// expired reports whether t is past its time at now.
func (t *tombstone) expired(now time.Time) bool {
	if t.Until.IsZero() {
		return now.Sub(t.At) > tombstoneTTL
	}
	return now.After(t.Until)
}

func sandboxKey(id string) string   { return sandboxPrefix + id }
func tombstoneKey(id string) string { return tombstonePrefix + id }

// cached is a record as the cache holds it, with the store revision it
// was read or written at.
type cached struct {
	rec record
	rev int64
}

// records is the cluster's read cache of the sandbox records in the
// store, kept current by a watch: reads (every proxied request resolves
// its sandbox) cost no round trip to etcd, and writes go to the store
// with compare-and-swap on the revision the cache holds. A write made here
// is in the cache at once, so a client reads its own writes; another
// server's writes arrive with the watch, milliseconds later.
type records struct {
	st state.Store
	// keys seal the tokens in the stored records.
	keys *sealed.Keyring

	mu sync.Mutex
	m  map[string]*cached
	// gone holds when ids were deleted here, so that an older event
	// still on its way through the watch cannot bring them back. Ids are
	// random and never reused, so an entry can simply expire once any
	// event of it must have arrived (goneFor).
	gone  map[string]time.Time
	swept time.Time
	// unknown are the ids lookup found no record of, a moment ago.
	unknown *unknownIDs
	// killedTTL is how long a killed sandbox's tombstone is kept.
	killedTTL time.Duration
}

// DefaultKilledRetention is how long a killed sandbox's tombstone is kept
// unless Config.KilledRetention says: as long as a node keeps an ended
// sandbox's history by default (node.DefaultEndedHistoryRetention, which
// this package cannot import: it reaches nodes only through their API).
const DefaultKilledRetention = time.Hour

// goneFor is far beyond any watch delay.
const goneFor = time.Minute

func newRecords(st state.Store, keys *sealed.Keyring) *records {
	return &records{st: st, keys: keys, m: map[string]*cached{}, gone: map[string]time.Time{}, unknown: newUnknownIDs(maxUnknown),
		killedTTL: DefaultKilledRetention}
}

// encodeRecord stores r with its tokens sealed with the data key, each
// bound to its record and field.
func encodeRecord(keys *sealed.Keyring, r *record) ([]byte, error) {
	s := toStored(r)
	s.EnvdAccessToken = keys.Seal(r.EnvdAccessToken, sandboxKey(r.ID)+"/envdAccessToken")
	s.TrafficAccessToken = keys.Seal(r.TrafficAccessToken, sandboxKey(r.ID)+"/trafficAccessToken")
	return json.Marshal(&s)
}

func decodeRecord(keys *sealed.Keyring, e state.Entry) (record, error) {
	var s storedRecord
	if err := json.Unmarshal(e.Value, &s); err != nil {
		return record{}, fmt.Errorf("decoding record %s: %w", e.Key, err)
	}
	var err1, err2 error
	s.EnvdAccessToken, err1 = keys.Open(s.EnvdAccessToken, sandboxKey(s.ID)+"/envdAccessToken")
	s.TrafficAccessToken, err2 = keys.Open(s.TrafficAccessToken, sandboxKey(s.ID)+"/trafficAccessToken")
	r := fromStored(&s)
	if err := errors.Join(err1, err2); err != nil {
		return r, fmt.Errorf("decoding record %s: %w", e.Key, err)
	}
	return r, nil
}

// load fills the cache from the store and returns the revision to watch
// from.
func (rs *records) load(ctx context.Context) (int64, error) {
	entries, rev, err := rs.st.List(ctx, sandboxPrefix)
	if err != nil {
		return 0, fmt.Errorf("loading sandbox records: %w", err)
	}
	m := make(map[string]*cached, len(entries))
	for _, e := range entries {
		r, err := decodeRecord(rs.keys, e)
		if err != nil {
			return 0, err
		}
		m[r.ID] = &cached{rec: r, rev: e.Revision}
	}
	rs.mu.Lock()
	rs.m = m
	rs.mu.Unlock()
	return rev, nil
}

// follow applies the store's changes to the cache until ctx ends,
// reloading when the watch falls behind compaction or breaks.
func (rs *records) follow(ctx context.Context, rev int64, onErr func(error)) {
	state.Follow(ctx, rs.st, sandboxPrefix, rev, rs.load, rs.apply, onErr)
}

func (rs *records) apply(ev state.Event) {
	id := strings.TrimPrefix(ev.Entry.Key, sandboxPrefix)
	rev := ev.Entry.Revision
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if at, ok := rs.gone[id]; ok {
		if time.Since(at) < goneFor {
			return
		}
		delete(rs.gone, id)
	}
	cur, ok := rs.m[id]
	if ok && cur.rev >= rev {
		return
	}
	switch ev.Type {
	case state.EventDelete:
		delete(rs.m, id)
		// Another server's delete: the quota's reservations need to know
		// the id is gone, not still being created.
		rs.markGone(id)
	case state.EventPut:
		r, err := decodeRecord(rs.keys, ev.Entry)
		if err != nil {
			return
		}
		rs.m[id] = &cached{rec: r, rev: rev}
	}
}

// set puts a record written at rev into the cache.
func (rs *records) set(r record, rev int64) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if cur, ok := rs.m[r.ID]; ok && cur.rev > rev {
		return
	}
	r.Metadata = maps.Clone(r.Metadata)
	rs.m[r.ID] = &cached{rec: r, rev: rev}
}

// drop removes a deleted record from the cache for good.
func (rs *records) drop(id string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	delete(rs.m, id)
	rs.markGone(id)
}

// markGone notes that id was deleted; rs.mu is held.
func (rs *records) markGone(id string) {
	now := time.Now()
	// Expired entries are swept at most once per goneFor, not per delete:
	// a mass kill deletes thousands at once.
	if now.Sub(rs.swept) > goneFor {
		for gid, at := range rs.gone {
			if now.Sub(at) > goneFor {
				delete(rs.gone, gid)
			}
		}
		rs.swept = now
	}
	rs.gone[id] = now
}

// has reports whether the cache holds id's record.
func (rs *records) has(id string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	_, ok := rs.m[id]
	return ok
}

// deletedRecently reports whether id's record was deleted in the last
// goneFor.
func (rs *records) deletedRecently(id string) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	at, ok := rs.gone[id]
	return ok && time.Since(at) < goneFor
}

// get returns a copy of the cached record and its revision.
func (rs *records) get(id string) (record, int64, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	c, ok := rs.m[id]
	if !ok {
		return record{}, 0, false
	}
	r := c.rec
	r.Metadata = maps.Clone(c.rec.Metadata)
	return r, c.rev, true
}

// route returns what the proxy needs of id's cached record, without
// copying the record.
func (rs *records) route(id string) (addr netip.Addr, nodeID, trafficToken, maskHost string, ok bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	c, ok := rs.m[id]
	if !ok {
		return netip.Addr{}, "", "", "", false
	}
	return c.rec.Addr, c.rec.NodeID, c.rec.TrafficAccessToken, c.rec.Network.MaskRequestHost, true
}

// each calls fn for every cached record, under the cache's lock: fn
// must not keep the record nor call into the cache.
func (rs *records) each(fn func(*record)) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, c := range rs.m {
		fn(&c.rec)
	}
}

// matching returns copies of the cached records keep accepts; only those
// are copied, so that a filtered list of a few out of 100,000 is cheap.
// keep must not keep the record it is given.
func (rs *records) matching(keep func(*record) bool) []record {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out []record
	for _, c := range rs.m {
		if !keep(&c.rec) {
			continue
		}
		r := c.rec
		r.Metadata = maps.Clone(c.rec.Metadata)
		out = append(out, r)
	}
	return out
}

// due returns the ids of running sandboxes, no operation in progress,
// whose deadline is before now. It copies nothing else: the leader calls
// it several times a second over every record.
func (rs *records) due(now time.Time) []string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var ids []string
	for id, c := range rs.m {
		if c.rec.State == StateRunning && c.rec.Op == "" && c.rec.EndAt.Before(now) {
			ids = append(ids, id)
		}
	}
	return ids
}

// fetch reads a record from the store (for ids the cache does not have
// yet: another server's create the watch has not delivered).
func (rs *records) fetch(ctx context.Context, id string) (record, int64, error) {
	e, err := rs.st.Get(ctx, sandboxKey(id))
	if err != nil {
		return record{}, 0, err
	}
	r, err := decodeRecord(rs.keys, e)
	if err != nil {
		return record{}, 0, err
	}
	rs.set(r, e.Revision)
	return r, e.Revision, nil
}

// create stores a new record.
func (rs *records) create(ctx context.Context, r record) error {
	b, err := encodeRecord(rs.keys, &r)
	if err != nil {
		return err
	}
	rev, err := rs.st.Create(ctx, sandboxKey(r.ID), b, state.WriteOptions{})
	if err != nil {
		return fmt.Errorf("storing record of %s: %w", r.ID, err)
	}
	rs.set(r, rev)
	return nil
}

// errUnchanged, returned by a mutate function, ends mutate without a write.
var errUnchanged = errors.New("unchanged")

// mutate applies fn to id's record with compare-and-swap, retrying on
// conflicts with a fresh read, and returns the record as stored. fn may
// return errUnchanged to skip the write; any other error aborts.
func (rs *records) mutate(ctx context.Context, id string, fn func(r *record) error) (record, error) {
	r, rev, ok := rs.get(id)
	for attempt := 0; ; attempt++ {
		if !ok || attempt > 0 {
			var err error
			if r, rev, err = rs.fetch(ctx, id); err != nil {
				if errors.Is(err, state.ErrNotFound) {
					rs.drop(id)
					return record{}, fmt.Errorf("%w: %s", ErrNotFound, id)
				}
				return record{}, err
			}
		}
		if err := fn(&r); err != nil {
			if errors.Is(err, errUnchanged) {
				return r, nil
			}
			return record{}, err
		}
		b, err := encodeRecord(rs.keys, &r)
		if err != nil {
			return record{}, err
		}
		nrev, err := rs.st.Update(ctx, sandboxKey(id), b, rev, state.WriteOptions{})
		if err == nil {
			rs.set(r, nrev)
			return r, nil
		}
		if !errors.Is(err, state.ErrConflict) && !errors.Is(err, state.ErrNotFound) || attempt >= 20 {
			return record{}, fmt.Errorf("updating record of %s: %w", id, err)
		}
	}
}

// remove deletes id's record, optionally leaving a tombstone that says
// why it is gone.
func (rs *records) remove(ctx context.Context, id, reason string) error {
	_, err := rs.removeIf(ctx, id, reason, func(*record) bool { return true })
	return err
}

// removeIf deletes id's record only while cond holds for it as it is in
// the store (compare-and-swap on its revision), then leaves the reason it
// is gone. It reports whether it removed it. The reports that a sandbox
// is lost or died come from what a node said a moment ago; a record that
// changed since (resumed elsewhere, moved, being paused) is not theirs to
// remove.
func (rs *records) removeIf(ctx context.Context, id, reason string, cond func(*record) bool) (bool, error) {
	r, rev, ok := rs.get(id)
	for range 3 {
		if !ok {
			var err error
			if r, rev, err = rs.fetch(ctx, id); errors.Is(err, state.ErrNotFound) {
				return false, nil
			} else if err != nil {
				return false, err
			}
		}
		if !cond(&r) {
			return false, nil
		}
		err := rs.st.Delete(ctx, sandboxKey(id), rev)
		switch {
		case err == nil:
			rs.drop(id)
			// A kill's tombstone only says whose the logs are, and goes
			// with them: an RL run's churn must not keep a key in etcd (and
			// its index in the heap) per sandbox for a day.
			now := time.Now().UTC()
			ttl := tombstoneTTL
			if reason == "" {
				ttl = rs.killedTTL
			}
			b, _ := json.Marshal(tombstone{Reason: reason, Team: r.TeamID(), At: now, Until: now.Add(ttl)})
			if _, err := rs.st.Put(ctx, tombstoneKey(id), b, state.WriteOptions{}); err != nil {
				return true, fmt.Errorf("recording why %s is gone: %w", id, err)
			}
			return true, nil
		case errors.Is(err, state.ErrNotFound):
			rs.drop(id)
			return false, nil
		case errors.Is(err, state.ErrConflict):
			ok = false // read it afresh
		default:
			return false, fmt.Errorf("deleting record of %s: %w", id, err)
		}
	}
	return false, fmt.Errorf("deleting record of %s: it keeps changing", id)
}

// whyGone returns the tombstone of a sandbox gone in the last day.
func (rs *records) whyGone(ctx context.Context, id string) (tombstone, bool) {
	e, err := rs.st.Get(ctx, tombstoneKey(id))
	if err != nil {
		return tombstone{}, false
	}
	var t tombstone
	if json.Unmarshal(e.Value, &t) != nil || t.expired(time.Now()) {
		return tombstone{}, false
	}
	return t, true
}
