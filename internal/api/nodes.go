package api

import (
	"fmt"
	"net/http"
	"regexp"

	"github.com/aenvhq/aenv/internal/cluster"
)

// nodeIDPattern is what node ids (host names by default) look like.
var nodeIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)

// listNodes answers GET /nodes (an aenv extension): every node the
// cluster has known, with its state (ready, draining, lost), capacity,
// usage, sandbox count and runtime.
func (s *Handler) listNodes(w http.ResponseWriter, r *http.Request) {
	nodes, err := s.cfg.Cluster.Nodes(r.Context())
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	if nodes == nil {
		nodes = []cluster.NodeInfo{}
	}
	writeJSON(w, http.StatusOK, nodes)
}

// withNodeID validates the {nodeID} path segment.
func withNodeID(next func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("nodeID")
		if !nodeIDPattern.MatchString(id) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid node id %q", id))
			return
		}
		next(w, r, id)
	}
}

// getNode answers GET /nodes/{nodeID}.
func (s *Handler) getNode(w http.ResponseWriter, r *http.Request, id string) {
	n, err := s.cfg.Cluster.GetNode(r.Context(), id)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, n)
}

// drainNode answers POST /nodes/{nodeID}/drain (the node takes no new
// sandboxes; its running ones keep running) and DELETE, which makes it
// ready again.
func (s *Handler) drainNode(w http.ResponseWriter, r *http.Request, id string) {
	n, err := s.cfg.Cluster.SetDraining(r.Context(), id, r.Method == http.MethodPost)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, n)
}

// migrateBody is POST /sandboxes/{id}/migrate's (an aenv extension).
type migrateBody struct {
	// NodeID is where to; empty lets placement choose.
	NodeID string `json:"nodeID"`
}

// migrationJSON answers a migration: the sandbox where it runs now, where
// it came from and how long it did not run.
type migrationJSON struct {
	sandboxJSON
	FromNodeID string `json:"fromNodeID"`
	DowntimeMs int64  `json:"downtimeMs"`
}

// migrate moves a running sandbox to another node, keeping its id.
func (s *Handler) migrate(w http.ResponseWriter, r *http.Request, id string) {
	var body migrateBody
	if r.ContentLength != 0 && !decodeBody(w, r, &body) {
		return
	}
	if body.NodeID != "" && !nodeIDPattern.MatchString(body.NodeID) {
		writeError(w, http.StatusBadRequest, "invalid nodeID")
		return
	}
	m, err := s.cfg.Cluster.Migrate(r.Context(), id, body.NodeID)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, migrationJSON{sandboxJSON: s.toJSON(m.Sandbox, true), FromNodeID: m.From, DowntimeMs: m.Downtime.Milliseconds()})
}
