package api

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/cluster"
)

// teamJSON is a team with what it uses (an aenv extension).
type teamJSON struct {
	apikeys.Team
	Usage teamUsageJSON `json:"usage"`
}

// teamUsageJSON is what a team has now, against its quota.
type teamUsageJSON struct {
	cluster.Usage
	Keys          int   `json:"keys"`
	SnapshotBytes int64 `json:"snapshotBytes"`
	Volumes       int   `json:"volumes"`
	VolumeBytes   int64 `json:"volumeBytes"`
}

func (s *Handler) teamJSON(r *http.Request, t apikeys.Team) teamJSON {
	u := teamUsageJSON{Usage: s.cfg.Cluster.TeamUsage(t.ID)}
	for _, k := range s.cfg.Keys.List() {
		if k.Team == t.ID {
			u.Keys++
		}
	}
	if b, err := s.cfg.Cluster.SnapshotBytes(r.Context(), t.ID); err == nil {
		u.SnapshotBytes = b
	}
	if vs, err := s.cfg.Cluster.ListVolumes(r.Context(), cluster.Owner{Team: t.ID}); err == nil {
		u.Volumes = len(vs)
		for _, v := range vs {
			u.VolumeBytes += v.SizeBytes
		}
	}
	return teamJSON{Team: t, Usage: u}
}

// listTeams answers GET /teams: every team for an admin, the caller's own
// otherwise.
func (s *Handler) listTeams(w http.ResponseWriter, r *http.Request) {
	if !s.keyStore(w) {
		return
	}
	o := owner(r)
	out := []teamJSON{}
	for _, t := range s.cfg.Keys.Teams() {
		if o.Sees(t.ID) {
			out = append(out, s.teamJSON(r, t))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// getTeam answers GET /teams/{teamID}: a team, its quota and its usage.
func (s *Handler) getTeam(w http.ResponseWriter, r *http.Request) {
	if !s.keyStore(w) {
		return
	}
	id := r.PathValue("teamID")
	t, ok := s.cfg.Keys.Team(id)
	if !ok || !owner(r).Sees(id) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("team %s not found", truncate(id)))
		return
	}
	writeJSON(w, http.StatusOK, s.teamJSON(r, t))
}

// teamBody is POST /teams's and PATCH /teams/{id}'s: quota fields left
// out stay as they are.
type teamBody struct {
	ID               string `json:"id"`
	MaxSandboxes     *int   `json:"maxSandboxes"`
	MaxPaused        *int   `json:"maxPaused"`
	MaxBuilds        *int   `json:"maxBuilds"`
	MaxVolumeBytes   *int64 `json:"maxVolumeBytes"`
	MaxSnapshotBytes *int64 `json:"maxSnapshotBytes"`
}

func (b teamBody) apply(q *apikeys.Quota) {
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&q.MaxSandboxes, b.MaxSandboxes)
	set(&q.MaxPaused, b.MaxPaused)
	set(&q.MaxBuilds, b.MaxBuilds)
	if b.MaxVolumeBytes != nil {
		q.MaxVolumeBytes = *b.MaxVolumeBytes
	}
	if b.MaxSnapshotBytes != nil {
		q.MaxSnapshotBytes = *b.MaxSnapshotBytes
	}
}

// createTeam answers POST /teams (admin keys only).
func (s *Handler) createTeam(w http.ResponseWriter, r *http.Request) {
	if !s.keyStore(w) {
		return
	}
	var body teamBody
	if !decodeBody(w, r, &body) {
		return
	}
	var q apikeys.Quota
	body.apply(&q)
	t, err := s.cfg.Keys.CreateTeam(r.Context(), body.ID, q)
	if err != nil {
		s.writeKeyError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.teamJSON(r, t))
}

// setTeam answers PATCH /teams/{teamID} (admin keys only): its quota.
func (s *Handler) setTeam(w http.ResponseWriter, r *http.Request) {
	if !s.keyStore(w) {
		return
	}
	var body teamBody
	if !decodeBody(w, r, &body) {
		return
	}
	t, err := s.cfg.Keys.SetQuota(r.Context(), r.PathValue("teamID"), body.apply)
	if err != nil {
		s.writeKeyError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.teamJSON(r, t))
}

// teamLimits is what the cluster enforces of team's quota.
func TeamLimits(keys *apikeys.Keys) func(team string) cluster.TeamLimits {
	return func(team string) cluster.TeamLimits {
		t, ok := keys.Team(team)
		if !ok {
			return cluster.TeamLimits{}
		}
		return cluster.TeamLimits{MaxSandboxes: t.MaxSandboxes, MaxPaused: t.MaxPaused,
			MaxVolumeBytes: t.MaxVolumeBytes, MaxSnapshotBytes: t.MaxSnapshotBytes}
	}
}

// TeamBuilds is a BuildLimiter that bounds each team's builds running at
// once on this server by its quota (MaxBuilds): past it a build waits its
// turn, in no particular order. The bound is this server's, not the
// cluster's: builds run on the servers that have a node, each with its
// own queue (--max-builds), and a team's builds on two such servers are
// two queues.
func TeamBuilds(keys *apikeys.Keys) func(ctx context.Context, team string) (func(), error) {
	var mu sync.Mutex
	running := map[string]int{}
	freed := make(chan struct{})
	release := func(team string) func() {
		var once sync.Once
		return func() {
			once.Do(func() {
				mu.Lock()
				if running[team]--; running[team] <= 0 {
					delete(running, team)
				}
				close(freed)
				freed = make(chan struct{})
				mu.Unlock()
			})
		}
	}
	return func(ctx context.Context, team string) (func(), error) {
		for {
			t, _ := keys.Team(team)
			mu.Lock()
			if t.MaxBuilds <= 0 || running[team] < t.MaxBuilds {
				running[team]++
				mu.Unlock()
				return release(team), nil
			}
			wait := freed
			mu.Unlock()
			select {
			case <-wait:
			case <-time.After(time.Second): // the quota may have grown
			case <-ctx.Done():
				return nil, fmt.Errorf("waiting for a build slot of team %s (it runs %d builds at once): %w", team, t.MaxBuilds, ctx.Err())
			}
		}
	}
}
