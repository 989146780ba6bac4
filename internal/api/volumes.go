package api

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/nodeapi"
)

// volumeJSON is E2B's Volume (the token only where E2B sends it), with
// its size in MiB (none for a volume from before sizes: unbounded).
type volumeJSON struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token,omitempty"`
	SizeMB   int64  `json:"sizeMB,omitempty"`
}

func toVolumeJSON(v *cluster.Volume, token bool) volumeJSON {
	out := volumeJSON{VolumeID: v.ID, Name: v.Name, SizeMB: v.SizeBytes >> 20}
	if token {
		out.Token = v.Token
	}
	return out
}

// createVolume makes a volume of sizeMB MiB (E2B's SDK sends none: the
// node's --volume-size).
func (s *Handler) createVolume(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Name   string `json:"name"`
		SizeMB int64  `json:"sizeMB"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if body.SizeMB != 0 && (body.SizeMB < nodeapi.MinVolumeSize>>20 || body.SizeMB > nodeapi.MaxVolumeSize>>20) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sizeMB %d: a volume's size is %d to %d MiB", body.SizeMB, nodeapi.MinVolumeSize>>20, nodeapi.MaxVolumeSize>>20))
		return
	}
	v, err := s.cfg.Cluster.CreateVolume(r.Context(), owner(r), body.Name, body.SizeMB<<20)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, toVolumeJSON(v, true))
}

func (s *Handler) listVolumes(w http.ResponseWriter, r *http.Request) {
	vs, err := s.cfg.Cluster.ListVolumes(r.Context(), owner(r))
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	out := []volumeJSON{}
	team := r.URL.Query().Get("team") // an admin's filter
	for _, v := range vs {
		if team == "" || v.TeamID() == team {
			out = append(out, toVolumeJSON(v, false))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Handler) getVolume(w http.ResponseWriter, r *http.Request) {
	v, err := s.cfg.Cluster.GetVolume(r.Context(), owner(r), r.PathValue("volumeID"))
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, toVolumeJSON(v, true))
}

func (s *Handler) deleteVolume(w http.ResponseWriter, r *http.Request) {
	if err := s.cfg.Cluster.DeleteVolume(r.Context(), owner(r), r.PathValue("volumeID")); err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// volumeContent serves /volumecontent/{volumeID}/...: the caller shows
// the volume's token (Authorization: Bearer), and the request goes to the
// node that holds the volume's files.
func (s *Handler) volumeContent(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, "/volumecontent/")
	id, _, _ := strings.Cut(rest, "/")
	if !ids.Valid(id) {
		writeError(w, http.StatusNotFound, "no volume has that id (ids match ^[a-z0-9]{1,64}$)")
		return
	}
	v, err := s.cfg.Cluster.VolumeForData(r.Context(), id)
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	switch {
	case errors.Is(err, cluster.ErrNotFound):
		writeError(w, http.StatusNotFound, fmt.Sprintf("volume %s not found", id))
		return
	case err != nil:
		s.writeClusterError(w, r, err)
		return
	case !ok || subtle.ConstantTimeCompare([]byte(token), []byte(v.Token)) != 1:
		writeError(w, http.StatusUnauthorized, "this volume's token is missing or wrong (Authorization: Bearer <token>)")
		return
	}
	if s.cfg.VolumeContent == nil {
		writeError(w, http.StatusNotImplemented, "volumes are not enabled on this server")
		return
	}
	h, err := s.cfg.VolumeContent(v.NodeID)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	h.ServeHTTP(w, r)
}

// parseVolumeMounts reads volumeMounts in either form E2B accepts: the
// array the SDK sends ([{name, path}]) or a map of path to volume name.
func parseVolumeMounts(raw json.RawMessage) ([]cluster.VolumeMount, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var list []cluster.VolumeMount
	if err := json.Unmarshal(raw, &list); err == nil {
		for _, m := range list {
			if m.Name == "" || m.Path == "" {
				return nil, errors.New("each volumeMounts entry needs a name and a path")
			}
		}
		return list, nil
	}
	var byPath map[string]json.RawMessage
	if err := json.Unmarshal(raw, &byPath); err != nil {
		return nil, errors.New("volumeMounts must be [{name, path}] or {path: name}")
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		var name string
		if err := json.Unmarshal(byPath[p], &name); err != nil {
			var obj struct {
				Name string `json:"name"`
			}
			if err := json.Unmarshal(byPath[p], &obj); err != nil || obj.Name == "" {
				return nil, fmt.Errorf("volumeMounts[%q] must be a volume name", p)
			}
			name = obj.Name
		}
		list = append(list, cluster.VolumeMount{Name: name, Path: p})
	}
	return list, nil
}
