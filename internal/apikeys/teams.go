package apikeys

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

const teamPrefix = "teams/"

// validTeam is what a team id may be: it names keys in the state store and
// directories on nodes.
var validTeam = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// ValidTeam reports whether s can name a team.
func ValidTeam(s string) bool { return validTeam.MatchString(s) }

// Team is a group of keys that share what they make: sandboxes,
// templates, snapshots, volumes and builds, and the quotas on them.
type Team struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"createdAt"`
	Quota
}

// Quota bounds a team; a zero field is no bound.
type Quota struct {
	// MaxSandboxes bounds its running sandboxes: creates, forks, resumes
	// (automatic ones too) and restores all count.
	MaxSandboxes int `json:"maxSandboxes,omitempty"`
	// MaxPaused bounds the paused sandboxes it keeps.
	MaxPaused int `json:"maxPaused,omitempty"`
	// MaxBuilds bounds its template builds running at once (past it a
	// build waits).
	MaxBuilds int `json:"maxBuilds,omitempty"`
	// MaxVolumeBytes and MaxSnapshotBytes bound the sizes of its volumes
	// and of its snapshots, in all.
	MaxVolumeBytes   int64 `json:"maxVolumeBytes,omitempty"`
	MaxSnapshotBytes int64 `json:"maxSnapshotBytes,omitempty"`
}

// ErrTeamExists: a team by that id exists already.
var ErrTeamExists = errors.New("team exists")

func (s *Keys) loadTeams(ctx context.Context) (int64, error) {
	entries, rev, err := s.st.List(ctx, teamPrefix)
	if err != nil {
		return 0, fmt.Errorf("loading teams: %w", err)
	}
	m := make(map[string]Team, len(entries))
	for _, e := range entries {
		var t Team
		if json.Unmarshal(e.Value, &t) == nil && t.ID != "" {
			m[t.ID] = t
		}
	}
	s.mu.Lock()
	s.teams = m
	s.mu.Unlock()
	return rev, nil
}

func (s *Keys) applyTeam(ev state.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ev.Type == state.EventDelete {
		delete(s.teams, strings.TrimPrefix(ev.Entry.Key, teamPrefix))
		return
	}
	var t Team
	if json.Unmarshal(ev.Entry.Value, &t) == nil && t.ID != "" {
		s.teams[t.ID] = t
	}
}

// Team returns team id. A team that keys name but that has no record (the
// team of its own every key from before teams has) exists with no quota.
func (s *Keys) Team(id string) (Team, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if t, ok := s.teams[id]; ok {
		return t, true
	}
	for _, k := range s.byHash {
		if withTeam(k).Team == id {
			return Team{ID: id, CreatedAt: k.CreatedAt}, true
		}
	}
	return Team{}, false
}

// Teams returns every team, by id: those recorded and those only keys
// name.
func (s *Keys) Teams() []Team {
	s.mu.RLock()
	m := make(map[string]Team, len(s.teams))
	for id, t := range s.teams {
		m[id] = t
	}
	for _, k := range s.byHash {
		if id := withTeam(k).Team; m[id].ID == "" {
			m[id] = Team{ID: id, CreatedAt: k.CreatedAt}
		}
	}
	s.mu.RUnlock()
	out := make([]Team, 0, len(m))
	for _, t := range m {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// CreateTeam records a new team.
func (s *Keys) CreateTeam(ctx context.Context, id string, q Quota) (Team, error) {
	if !ValidTeam(id) {
		return Team{}, fmt.Errorf("%w: team %q: 1-40 lowercase letters, digits or '-', starting with a letter or digit", ErrInvalid, truncate(id))
	}
	if err := q.validate(); err != nil {
		return Team{}, err
	}
	t := Team{ID: id, CreatedAt: time.Now().UTC(), Quota: q}
	b, _ := json.Marshal(t)
	if _, err := s.st.Create(ctx, teamPrefix+id, b, state.WriteOptions{}); errors.Is(err, state.ErrExists) {
		return Team{}, fmt.Errorf("%w: %s", ErrTeamExists, id)
	} else if err != nil {
		return Team{}, fmt.Errorf("creating team %s: %w", id, err)
	}
	s.mu.Lock()
	s.teams[id] = t
	s.mu.Unlock()
	s.log.Info("team created", "team", id)
	return t, nil
}

// ensureTeam records team id if it is not yet.
func (s *Keys) ensureTeam(ctx context.Context, id string) error {
	if _, ok := s.Team(id); ok {
		return nil
	}
	if _, err := s.CreateTeam(ctx, id, Quota{}); err != nil && !errors.Is(err, ErrTeamExists) {
		return err
	}
	return nil
}

// SetQuota changes what fn changes of team id's quota, with
// compare-and-swap so that two admins' changes do not undo each other. A
// team only keys named so far is recorded by it.
func (s *Keys) SetQuota(ctx context.Context, id string, fn func(*Quota)) (Team, error) {
	if !ValidTeam(id) {
		return Team{}, fmt.Errorf("%w: team %s", ErrNotFound, truncate(id))
	}
	for range 10 {
		e, err := s.st.Get(ctx, teamPrefix+id)
		var t Team
		switch {
		case errors.Is(err, state.ErrNotFound):
			cur, ok := s.Team(id)
			if !ok {
				return Team{}, fmt.Errorf("%w: team %s", ErrNotFound, id)
			}
			t = cur
		case err != nil:
			return Team{}, fmt.Errorf("reading team %s: %w", id, err)
		default:
			if err := json.Unmarshal(e.Value, &t); err != nil {
				return Team{}, fmt.Errorf("reading team %s: %w", id, err)
			}
		}
		fn(&t.Quota)
		if err := t.Quota.validate(); err != nil {
			return Team{}, err
		}
		b, _ := json.Marshal(t)
		if e.Revision == 0 {
			_, err = s.st.Create(ctx, teamPrefix+id, b, state.WriteOptions{})
		} else {
			_, err = s.st.Update(ctx, teamPrefix+id, b, e.Revision, state.WriteOptions{})
		}
		if errors.Is(err, state.ErrConflict) || errors.Is(err, state.ErrExists) {
			continue
		}
		if err != nil {
			return Team{}, fmt.Errorf("updating team %s: %w", id, err)
		}
		s.mu.Lock()
		s.teams[id] = t
		s.mu.Unlock()
		s.log.Info("team quota set", "team", id, "max_sandboxes", t.MaxSandboxes, "max_paused", t.MaxPaused, "max_builds", t.MaxBuilds,
			"max_volume_bytes", t.MaxVolumeBytes, "max_snapshot_bytes", t.MaxSnapshotBytes)
		return t, nil
	}
	return Team{}, fmt.Errorf("updating team %s: it keeps changing", id)
}

func (q Quota) validate() error {
	if q.MaxSandboxes < 0 || q.MaxPaused < 0 || q.MaxBuilds < 0 || q.MaxVolumeBytes < 0 || q.MaxSnapshotBytes < 0 {
		return fmt.Errorf("%w: quotas must not be negative (0 is no bound)", ErrInvalid)
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
