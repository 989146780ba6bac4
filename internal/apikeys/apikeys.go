// Package apikeys keeps the cluster's API keys and the teams they belong
// to in the live state store, so that every API server accepts the same
// keys and a key revoked on one is refused by all of them within
// milliseconds. Only a key's SHA-256 is stored: the key itself is shown
// once, when it is created. Each server holds keys and teams in caches its
// watches keep current, so checking a key costs no round trip. The api
// package and the server wiring import it.
package apikeys

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

const (
	prefix = "apikeys/"
	// seenPrefix marks the keys a server recorded as its own, so that a
	// revoked one is not added again at the server's next start.
	seenPrefix = "apikeys-seen/"
)

// Errors callers map to statuses.
var (
	ErrNotFound = errors.New("API key not found")
	ErrInvalid  = errors.New("invalid API key request")
	// ErrRevoked: a server's own key was revoked; it is not added again.
	ErrRevoked = errors.New("API key was revoked")
)

// Key is what the cluster knows of an API key.
type Key struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Hint is the key's first characters, to tell keys apart in lists.
	Hint string `json:"hint"`
	// Team owns everything the key makes; a key sees only its team's
	// resources (admin keys see every team's). Keys from before teams
	// have none: each is then a team of its own (TeamOf).
	Team string `json:"team,omitempty"`
	// Admin keys are the operator's: they manage keys, teams and nodes,
	// and act across teams.
	Admin bool `json:"admin,omitempty"`
	// MaxSandboxes bounds the running sandboxes created with the key
	// (0: no bound).
	MaxSandboxes int       `json:"maxSandboxes,omitempty"`
	CreatedAt    time.Time `json:"createdAt"`
	SHA256       string    `json:"sha256"`
}

// keyPattern is the shape E2B's SDKs accept.
var keyPattern = regexp.MustCompile(`^e2b_[0-9a-f]+$`)

// ValidKey reports whether s is shaped like an API key.
func ValidKey(s string) bool { return keyPattern.MatchString(s) }

// NewKey makes a random API key.
func NewKey() string {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	return "e2b_" + hex.EncodeToString(b)
}

func hashOf(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// idOf is a key's id: a short prefix of its hash, so that the same key
// always gets the same id (a restarted server re-adds its own key as it
// was) without revealing it.
func idOf(hash string) string { return "k" + hash[:11] }

// Keys holds the cluster's API keys and teams, cached from the live
// state. It is safe for concurrent use.
type Keys struct {
	st  state.Store
	log *slog.Logger

	mu     sync.RWMutex
	byHash map[string]Key
	teams  map[string]Team

	stop context.CancelFunc
	done sync.WaitGroup
}

// Open loads the keys and follows changes to them until Close.
func Open(ctx context.Context, st state.Store, log *slog.Logger) (*Keys, error) {
	s := &Keys{st: st, log: log, byHash: map[string]Key{}, teams: map[string]Team{}}
	rev, err := s.load(ctx)
	if err != nil {
		return nil, err
	}
	teamRev, err := s.loadTeams(ctx)
	if err != nil {
		return nil, err
	}
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = stop
	s.done.Add(2)
	go func() {
		defer s.done.Done()
		state.Follow(bg, st, prefix, rev, s.load, s.apply, func(err error) { log.Warn("following API keys", "err", err) })
	}()
	go func() {
		defer s.done.Done()
		state.Follow(bg, st, teamPrefix, teamRev, s.loadTeams, s.applyTeam, func(err error) { log.Warn("following teams", "err", err) })
	}()
	return s, nil
}

// Close stops following the store.
func (s *Keys) Close() {
	s.stop()
	s.done.Wait()
}

func (s *Keys) load(ctx context.Context) (int64, error) {
	entries, rev, err := s.st.List(ctx, prefix)
	if err != nil {
		return 0, fmt.Errorf("loading API keys: %w", err)
	}
	m := make(map[string]Key, len(entries))
	for _, e := range entries {
		var k Key
		if json.Unmarshal(e.Value, &k) == nil && k.SHA256 != "" {
			m[k.SHA256] = withTeam(k)
		}
	}
	s.mu.Lock()
	s.byHash = m
	s.mu.Unlock()
	return rev, nil
}

func (s *Keys) apply(ev state.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := strings.TrimPrefix(ev.Entry.Key, prefix)
	if ev.Type == state.EventDelete {
		for h, k := range s.byHash {
			if k.ID == id {
				delete(s.byHash, h)
			}
		}
		return
	}
	var k Key
	if json.Unmarshal(ev.Entry.Value, &k) == nil && k.SHA256 != "" {
		s.byHash[k.SHA256] = withTeam(k)
	}
}

// withTeam gives a key from before teams the team of its own it has
// been since: its id, which is also what its records name (keyID).
func withTeam(k Key) Key {
	if k.Team == "" {
		k.Team = k.ID
	}
	return k
}

// Lookup returns the key a client presented, if the cluster has it.
// Keys are found by their hash, so the comparison leaks nothing of them.
func (s *Keys) Lookup(key string) (Key, bool) {
	if !ValidKey(key) {
		return Key{}, false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	k, ok := s.byHash[hashOf(key)]
	return k, ok
}

// LookupHash returns the key whose SHA-256 (hex, as Key.SHA256) is sum,
// if the cluster still has it: for sessions that name a key without
// holding it (the web console's), which a revocation ends.
func (s *Keys) LookupHash(sum string) (Key, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	k, ok := s.byHash[sum]
	return k, ok
}

// Ensure records key (a server's own, from its data directory) as an
// admin key of a team of its own, if it is not yet: every server of the
// cluster then accepts it. A key once recorded this way and revoked since
// is not added again (ErrRevoked): revoking a server's key must hold
// across that server's restarts.
func (s *Keys) Ensure(ctx context.Context, key, name string) (Key, error) {
	if !ValidKey(key) {
		return Key{}, fmt.Errorf("%w: keys look like e2b_<hex>", ErrInvalid)
	}
	if k, ok := s.Lookup(key); ok {
		return k, nil
	}
	id := idOf(hashOf(key))
	if _, err := s.st.Create(ctx, seenPrefix+id, []byte(time.Now().UTC().Format(time.RFC3339)), state.WriteOptions{}); errors.Is(err, state.ErrExists) {
		// Recorded before: either revoked, or another server added it
		// a moment ago (its watch event is on the way).
		e, err := s.st.Get(ctx, prefix+id)
		if errors.Is(err, state.ErrNotFound) {
			return Key{}, fmt.Errorf("%w: %s (create another with `aenv keys create --admin`, or set a new one in AENV_API_KEY)", ErrRevoked, id)
		}
		if err != nil {
			return Key{}, fmt.Errorf("reading API key %s: %w", id, err)
		}
		var k Key
		if err := json.Unmarshal(e.Value, &k); err != nil {
			return Key{}, fmt.Errorf("reading API key %s: %w", e.Key, err)
		}
		return withTeam(k), nil
	} else if err != nil {
		return Key{}, fmt.Errorf("recording API key %s: %w", id, err)
	}
	k, err := s.put(ctx, key, KeyOptions{Name: name, Admin: true, Team: id})
	if errors.Is(err, state.ErrExists) {
		// Recorded by a server from before the seen marks.
		return s.Ensure(ctx, key, name)
	}
	return k, err
}

// KeyOptions describe a new key.
type KeyOptions struct {
	Name string
	// Team is the team the key belongs to; empty gives it a team of its
	// own (named by the key's id).
	Team string
	// MaxSandboxes bounds the key's own running sandboxes (0: no bound),
	// within its team's quota.
	MaxSandboxes int
	Admin        bool
}

// Create makes a new key; the key itself is returned this once. A team
// named by opts that does not exist yet is created.
func (s *Keys) Create(ctx context.Context, opts KeyOptions) (string, Key, error) {
	if opts.Name == "" || len(opts.Name) > 128 {
		return "", Key{}, fmt.Errorf("%w: a key's name must be 1 to 128 characters", ErrInvalid)
	}
	if opts.MaxSandboxes < 0 {
		return "", Key{}, fmt.Errorf("%w: maxSandboxes must not be negative", ErrInvalid)
	}
	key := NewKey()
	if opts.Team == "" {
		opts.Team = idOf(hashOf(key))
	}
	if err := s.ensureTeam(ctx, opts.Team); err != nil {
		return "", Key{}, err
	}
	k, err := s.put(ctx, key, opts)
	if err != nil {
		return "", Key{}, err
	}
	s.log.Info("API key created", "key_id", k.ID, "name", k.Name, "team", k.Team, "admin", k.Admin, "max_sandboxes", k.MaxSandboxes)
	return key, k, nil
}

func (s *Keys) put(ctx context.Context, key string, opts KeyOptions) (Key, error) {
	h := hashOf(key)
	k := Key{ID: idOf(h), Name: opts.Name, Hint: key[:8] + "...", Team: opts.Team, Admin: opts.Admin, MaxSandboxes: opts.MaxSandboxes,
		CreatedAt: time.Now().UTC(), SHA256: h}
	b, err := json.Marshal(k)
	if err != nil {
		return Key{}, err
	}
	if _, err := s.st.Create(ctx, prefix+k.ID, b, state.WriteOptions{}); err != nil {
		return Key{}, fmt.Errorf("storing API key %s: %w", k.ID, err)
	}
	s.mu.Lock()
	s.byHash[h] = k
	s.mu.Unlock()
	return k, nil
}

// List returns every key, oldest first (without their hashes).
func (s *Keys) List() []Key {
	s.mu.RLock()
	out := make([]Key, 0, len(s.byHash))
	for _, k := range s.byHash {
		k.SHA256 = ""
		out = append(out, k)
	}
	s.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Revoke removes a key: no server accepts it any more.
func (s *Keys) Revoke(ctx context.Context, id string) error {
	if err := s.st.Delete(ctx, prefix+id, 0); errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	} else if err != nil {
		return fmt.Errorf("revoking API key %s: %w", id, err)
	}
	s.apply(state.Event{Type: state.EventDelete, Entry: state.Entry{Key: prefix + id}})
	s.log.Info("API key revoked", "key_id", id)
	return nil
}
