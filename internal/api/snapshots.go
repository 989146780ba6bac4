package api

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/template"
)

// snapshotJSON is E2B's SnapshotInfo, with aenv's extra detail.
type snapshotJSON struct {
	SnapshotID string    `json:"snapshotID"`
	Names      []string  `json:"names"`
	SandboxID  string    `json:"sandboxID,omitempty"`
	TemplateID string    `json:"templateID,omitempty"`
	CPUCount   int       `json:"cpuCount,omitempty"`
	MemoryMB   int       `json:"memoryMB,omitempty"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`
}

func toSnapshotJSON(s *snapshot.Snapshot) snapshotJSON {
	names := s.Names
	if names == nil {
		names = []string{}
	}
	return snapshotJSON{
		SnapshotID: s.ID, Names: names, SandboxID: s.SandboxID, TemplateID: s.TemplateID,
		CPUCount: s.CPUCount, MemoryMB: s.MemoryMB, SizeBytes: s.SizeBytes, CreatedAt: s.CreatedAt,
	}
}

func (s *Handler) createSnapshot(w http.ResponseWriter, r *http.Request, id string) {
	var body struct {
		Name string `json:"name"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Name != "" {
		// A snapshot's name works as a templateID, where the team's
		// templates come first: one that a template hides is refused.
		sb, err := s.cfg.Cluster.Get(r.Context(), id)
		if err != nil {
			s.writeClusterError(w, r, err)
			return
		}
		if len(body.Name) <= maxTemplateName {
			if _, err := s.cfg.Templates.Get(teamTemplateID(sb.TeamID(), body.Name)); err == nil {
				writeError(w, http.StatusConflict, fmt.Sprintf("the team has a template named %q; a snapshot of that name would never be found by it", body.Name))
				return
			}
		}
	}
	snap, err := s.cfg.Cluster.Snapshot(r.Context(), id, body.Name)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toSnapshotJSON(snap))
}

func (s *Handler) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	all, err := s.cfg.Cluster.Snapshots(r.Context(), owner(r))
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	limit, ok := parseLimit(w, q)
	if !ok {
		return
	}
	after := q.Get("nextToken")
	out := []snapshotJSON{}
	for _, snap := range all {
		if sid := q.Get("sandboxID"); sid != "" && snap.SandboxID != sid {
			continue
		}
		if name := q.Get("name"); name != "" && !contains(snap.Names, name) {
			continue
		}
		if team := q.Get("team"); team != "" && snap.Team != team {
			continue
		}
		if after != "" {
			if snap.ID == after {
				after = ""
			}
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", out[len(out)-1].SnapshotID)
			break
		}
		out = append(out, toSnapshotJSON(snap.Snapshot))
	}
	writeJSON(w, http.StatusOK, out)
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

func (s *Handler) getSnapshot(w http.ResponseWriter, r *http.Request) {
	snap, err := s.cfg.Cluster.GetSnapshot(r.Context(), owner(r), r.PathValue("snapshotID"))
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toSnapshotJSON(snap.Snapshot))
}

// deleteTemplate deletes a snapshot (E2B deletes snapshots through the
// template route) or a template of the caller's team. Another team's is
// not found; a public or built-in one is read-only but for admins.
func (s *Handler) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("templateID")
	o := owner(r)
	err := s.cfg.Cluster.DeleteSnapshot(r.Context(), o, id)
	if !errors.Is(err, cluster.ErrNotFound) {
		if err != nil {
			s.writeClusterError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	t, acc, err := s.findTemplate(r.Context(), o, id)
	switch {
	case errors.Is(err, template.ErrNotFound):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no template or snapshot %q", id))
		return
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	case t.ID == template.BaseID:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("deleting template %s: %v", t.ID, template.ErrProtected))
		return
	case acc != templateOwned:
		writeError(w, http.StatusForbidden, fmt.Sprintf("template %s is public or built in: only an admin key may delete it", id))
		return
	}
	// A template's tree is what its sandboxes and snapshots run on.
	n, err := s.cfg.Cluster.TemplateUsers(r.Context(), t.ID)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	if n > 0 {
		writeError(w, http.StatusConflict, fmt.Sprintf("template %s is in use by %d sandboxes or snapshots; kill or delete them first", id, n))
		return
	}
	err = s.cfg.Templates.Delete(t.ID)
	if errors.Is(err, template.ErrProtected) {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if derr := s.cfg.Cluster.DeleteTemplateSnapshots(r.Context(), t.ID); derr != nil {
		s.log.Warn("deleting the snapshots of a deleted template's service", "template_id", t.ID, "err", derr)
	}
	if derr := s.cfg.Cluster.SetTemplatePublic(r.Context(), t.ID, false); derr != nil {
		s.log.Warn("dropping a deleted template's public mark", "template_id", t.ID, "err", derr)
	}
	w.WriteHeader(http.StatusNoContent)
}

// forkResultJSON is one child's outcome.
type forkResultJSON struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

func (s *Handler) fork(w http.ResponseWriter, r *http.Request, id string) {
	var body struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	timeout := defaultTimeoutV2
	if body.Timeout != nil {
		// Checked before the multiplication, which would overflow.
		max := int64(s.cfg.Cluster.Limits().MaxTimeout / time.Second)
		if t := *body.Timeout; t < 1 || t > max {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout must be between 1 and %d seconds, got %d", max, t))
			return
		}
		timeout = time.Duration(*body.Timeout) * time.Second
	}
	results, err := s.cfg.Cluster.Fork(r.Context(), id, count, timeout, owner(r))
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	out := make([]forkResultJSON, len(results))
	for i, res := range results {
		if res.Err != nil {
			out[i].Error = &apiError{Code: clusterStatus(res.Err), Message: res.Err.Error()}
			continue
		}
		sb := s.toJSON(res.Sandbox, false)
		out[i].Sandbox = &sb
	}
	// 201, as E2B's spec says: the Python SDK reads the body of no other
	// status (the JS SDK takes any 2xx).
	writeJSON(w, http.StatusCreated, out)
}
