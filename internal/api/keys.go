package api

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"

	"github.com/aenvhq/aenv/internal/apikeys"
)

// createKeyBody is POST /keys's (an aenv extension).
type createKeyBody struct {
	Name string `json:"name"`
	// Team is the team the key joins (made if new); empty gives the key
	// a team of its own.
	Team         string `json:"team"`
	MaxSandboxes int    `json:"maxSandboxes"`
	Admin        bool   `json:"admin"`
}

// createdKeyJSON carries the new key itself, shown this once.
type createdKeyJSON struct {
	apikeys.Key
	Secret string `json:"key"`
}

func (s *Handler) keyStore(w http.ResponseWriter) bool {
	if s.cfg.Keys == nil {
		writeError(w, http.StatusNotImplemented, "this server keeps no API keys of its own")
		return false
	}
	return true
}

// listKeys answers GET /keys (admin keys only).
func (s *Handler) listKeys(w http.ResponseWriter, r *http.Request) {
	if s.keyStore(w) {
		writeJSON(w, http.StatusOK, s.cfg.Keys.List())
	}
}

// createKey answers POST /keys (admin keys only).
func (s *Handler) createKey(w http.ResponseWriter, r *http.Request) {
	if !s.keyStore(w) {
		return
	}
	var body createKeyBody
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Team != "" && !apikeys.ValidTeam(body.Team) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid team %q: 1-40 lowercase letters, digits or '-'", truncate(body.Team)))
		return
	}
	key, k, err := s.cfg.Keys.Create(r.Context(), apikeys.KeyOptions{Name: body.Name, Team: body.Team, MaxSandboxes: body.MaxSandboxes, Admin: body.Admin})
	if err != nil {
		s.writeKeyError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, createdKeyJSON{Key: k, Secret: key})
}

var keyIDPattern = regexp.MustCompile(`^k[0-9a-f]{1,64}$`)

// revokeKey answers DELETE /keys/{keyID} (admin keys only).
func (s *Handler) revokeKey(w http.ResponseWriter, r *http.Request) {
	if !s.keyStore(w) {
		return
	}
	id := r.PathValue("keyID")
	if !keyIDPattern.MatchString(id) {
		writeError(w, http.StatusBadRequest, "invalid key id")
		return
	}
	if id == callerKey(r).ID {
		writeError(w, http.StatusConflict, "a key cannot revoke itself")
		return
	}
	if err := s.cfg.Keys.Revoke(r.Context(), id); err != nil {
		s.writeKeyError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Handler) writeKeyError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, apikeys.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, apikeys.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, apikeys.ErrTeamExists):
		writeError(w, http.StatusConflict, err.Error())
	default:
		s.writeClusterError(w, r, err)
	}
}
