package api

import (
	"errors"
	"net/http"
	"time"

	"github.com/aenvhq/aenv/internal/template"
)

// templateJSON is E2B's Template as the list route returns it.
type templateJSON struct {
	TemplateID string    `json:"templateID"`
	BuildID    string    `json:"buildID"`
	Aliases    []string  `json:"aliases"`
	CPUCount   int       `json:"cpuCount"`
	MemoryMB   int       `json:"memoryMB"`
	DiskSizeMB int       `json:"diskSizeMB"`
	Public     bool      `json:"public"`
	CreatedAt  time.Time `json:"createdAt"`
	UpdatedAt  time.Time `json:"updatedAt"`
	// SizeBytes (an aenv extension) is the disk space the root filesystem
	// takes.
	SizeBytes int64 `json:"sizeBytes"`
	// ImageBytes and UniqueBytes (aenv extensions) are its block image's
	// size, and the part of it no other template's image shares in the
	// store (what deleting it frees).
	ImageBytes  int64 `json:"imageBytes,omitempty"`
	UniqueBytes int64 `json:"uniqueBytes,omitempty"`
}

func toTemplateJSON(t *template.Template) templateJSON {
	aliases := t.Aliases
	if aliases == nil {
		aliases = []string{}
	}
	return templateJSON{
		TemplateID: t.ID, BuildID: t.ID, Aliases: aliases,
		CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskMB,
		CreatedAt: t.CreatedAt, UpdatedAt: t.CreatedAt, SizeBytes: t.SizeBytes,
	}
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.cfg.Templates.List()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	usage := s.cfg.Templates.UsageOf(r.Context(), ts)
	out := make([]templateJSON, 0, len(ts))
	for _, t := range ts {
		j := toTemplateJSON(t)
		j.ImageBytes, j.UniqueBytes = t.ImageBytes, usage.Templates[t.ID]
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, out)
}

// templateUsage answers GET /templates/usage: what the templates' block
// images take as images and, deduplicated, in the store.
func (s *Server) templateUsage(w http.ResponseWriter, r *http.Request) {
	u, err := s.cfg.Templates.Usage(r.Context())
	if err != nil {
		writeError(w, http.StatusBadGateway, "measuring the templates' images: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, u)
}

func (s *Server) getTemplateAlias(w http.ResponseWriter, r *http.Request) {
	alias := r.PathValue("alias")
	t, err := s.cfg.Templates.Get(alias)
	if errors.Is(err, template.ErrNotFound) {
		writeError(w, http.StatusNotFound, "template alias "+alias+" not found")
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templateID": t.ID, "public": false})
}
