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
	out := make([]templateJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, toTemplateJSON(t))
	}
	writeJSON(w, http.StatusOK, out)
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
