package api

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/envd"
	"github.com/aenvhq/aenv/internal/template"
)

// templateJSON is E2B's Template as the list route returns it.
type templateJSON struct {
	TemplateID string `json:"templateID"`
	BuildID    string `json:"buildID"`
	// Names are what a create may name the template by (E2B's newer
	// field; the e2b CLI shows Aliases, the older one): the two agree.
	Aliases    []string  `json:"aliases"`
	Names      []string  `json:"names"`
	CPUCount   int       `json:"cpuCount"`
	MemoryMB   int       `json:"memoryMB"`
	DiskSizeMB int       `json:"diskSizeMB"`
	Public     bool      `json:"public"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	// CreatedBy is always null: keys, not users, make templates here.
	CreatedBy *teamUserJSON `json:"createdBy"`
	// LastSpawnedAt (null) and SpawnCount (0) are required by E2B's
	// schema; aenv does not count a template's sandboxes.
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	// BuildCount is 1 and BuildStatus ready: a template is stored once
	// its one build has finished (a new build of the name replaces it).
	BuildCount  int    `json:"buildCount"`
	BuildStatus string `json:"buildStatus"`
	// EnvdVersion is the envd its sandboxes get: the node injects envd,
	// no template carries its own.
	EnvdVersion string `json:"envdVersion"`
	// SizeBytes (an aenv extension) is the disk space the root filesystem
	// takes.
	SizeBytes int64 `json:"sizeBytes"`
	// ImageBytes and UniqueBytes (aenv extensions) are its block image's
	// size, and the part of it no other template's image shares in the
	// store (what deleting it frees).
	ImageBytes  int64 `json:"imageBytes,omitempty"`
	UniqueBytes int64 `json:"uniqueBytes,omitempty"`
	// Team (an aenv extension) owns it; empty for base, the builtins and
	// templates from before teams, which every team sees.
	Team string `json:"team,omitempty"`
}

// teamUserJSON is E2B's TeamUser.
type teamUserJSON struct {
	ID    string `json:"id"`
	Email string `json:"email"`
}

func toTemplateJSON(t *template.Template, public map[string]bool) templateJSON {
	aliases := t.Aliases
	if t.Name != "" {
		aliases = []string{t.Name}
	}
	if len(aliases) == 0 {
		// base, the builtins and templates from before teams are
		// created by their id: it is their name.
		aliases = []string{t.ID}
	}
	return templateJSON{
		TemplateID: t.ID, BuildID: t.ID, Aliases: aliases, Names: slices.Clone(aliases),
		CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskMB,
		CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt, SizeBytes: t.SizeBytes,
		BuildCount: 1, BuildStatus: "ready", EnvdVersion: envd.Version,
		Public: t.Team == "" || public[t.ID], Team: t.Team,
	}
}

// listTemplates answers GET /templates: the caller's team's templates and
// those every team sees (an admin's: every team's, or ?team='s).
func (s *Handler) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, public, err := s.visibleTemplates(r.Context(), owner(r))
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	if team := r.URL.Query().Get("team"); team != "" {
		kept := ts[:0]
		for _, t := range ts {
			if t.Team == team {
				kept = append(kept, t)
			}
		}
		ts = kept
	}
	usage := s.cfg.Templates.UsageOf(r.Context(), ts)
	out := make([]templateJSON, 0, len(ts))
	for _, t := range ts {
		j := toTemplateJSON(t, public)
		j.ImageBytes, j.UniqueBytes = t.ImageBytes, usage.Templates[t.ID]
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, out)
}

// patchTemplate answers PATCH /templates/{templateID} {public}: an admin
// makes a template visible (read-only) to every team, or private again.
func (s *Handler) patchTemplate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Public *bool `json:"public"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Public == nil {
		writeError(w, http.StatusBadRequest, "give public: true or false")
		return
	}
	t, _, err := s.findTemplate(r.Context(), owner(r), r.PathValue("templateID"))
	if errors.Is(err, template.ErrNotFound) {
		writeError(w, http.StatusNotFound, "template "+r.PathValue("templateID")+" not found")
		return
	}
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	if t.Team == "" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("template %s belongs to no team: every team sees it already", t.ID))
		return
	}
	if *body.Public && t.Name != "" {
		// A create resolves public templates by name: two of one name
		// would make which one it gets depend on their age.
		if other, _, err := s.findTemplate(r.Context(), cluster.Owner{}, t.Name); err == nil && other.ID != t.ID {
			writeError(w, http.StatusConflict, fmt.Sprintf("a public template named %q exists (%s)", t.Name, other.ID))
			return
		}
	}
	if err := s.cfg.Cluster.SetTemplatePublic(r.Context(), t.ID, *body.Public); err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	public, _ := s.cfg.Cluster.PublicTemplates(r.Context())
	writeJSON(w, http.StatusOK, toTemplateJSON(t, public))
}

// templateUsage answers GET /templates/usage: what the templates' block
// images take as images and, deduplicated, in the store.
func (s *Handler) templateUsage(w http.ResponseWriter, r *http.Request) {
	u, err := s.cfg.Templates.Usage(r.Context())
	if err != nil {
		writeError(w, http.StatusBadGateway, "measuring the templates' images: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, u)
}

func (s *Handler) getTemplateAlias(w http.ResponseWriter, r *http.Request) {
	alias := r.PathValue("alias")
	t, acc, err := s.findTemplate(r.Context(), owner(r), alias)
	if errors.Is(err, template.ErrNotFound) {
		writeError(w, http.StatusNotFound, "template alias "+alias+" not found")
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": t.ID, "public": acc == templateReadOnly})
}
