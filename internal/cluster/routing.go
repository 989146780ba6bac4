package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/aenvhq/aenv/internal/state"
)

// Get returns a copy of a sandbox's record. For an id that is gone for a
// known reason (lost, died) in the last 24 h the ErrNotFound says why.
func (c *Cluster) Get(ctx context.Context, id string) (*Sandbox, error) {
	r, _, ok := c.recs.get(id)
	if !ok {
		var err error
		if r, _, err = c.recs.fetch(ctx, id); err != nil {
			if errors.Is(err, state.ErrNotFound) {
				return nil, c.notFound(ctx, id)
			}
			return nil, fmt.Errorf("looking up sandbox %s: %w", id, err)
		}
	}
	out := r.Sandbox
	return &out, nil
}

// Route is how the proxy reaches a sandbox's ports.
type Route struct {
	// Addr is the sandbox's address on its node.
	Addr netip.Addr
	// Via is the node agent that forwards to it (host:port); empty when
	// the sandbox runs on this server's own node.
	Via string
	// TrafficToken, when set, must come with requests to the sandbox's
	// own ports (not envd's).
	TrafficToken string
	// MaskRequestHost, when set, replaces the Host of requests to the
	// sandbox's own ports (${PORT} becomes the port).
	MaskRequestHost string
}

// Route says how to reach sandbox id's ports. The proxy asks it on every
// request, so it reads the caches without copying the record; an id they
// lack costs at most one bounded store read (see records.lookup).
func (c *Cluster) Route(ctx context.Context, id string) (Route, error) {
	a, nodeID, token, mask, ok := c.recs.route(id)
	if !ok {
		r, err := c.recs.lookup(ctx, id)
		if err != nil {
			return Route{}, err
		}
		a, nodeID, token, mask = r.Addr, r.NodeID, r.TrafficAccessToken, r.Network.MaskRequestHost
	}
	if !a.IsValid() {
		return Route{}, fmt.Errorf("%w: sandbox %s is not running", ErrConflict, id)
	}
	via, ok := c.nodes.address(nodeID)
	if !ok {
		// The fleet says why: not registered, lost, or inside another
		// server that advertises no address.
		_, err := c.nodes.node(nodeID)
		if err == nil {
			err = fmt.Errorf("%w: node %s is not reachable", ErrUnavailable, nodeID)
		}
		return Route{}, fmt.Errorf("reaching sandbox %s: %w", id, err)
	}
	return Route{Addr: a, Via: via, TrafficToken: token, MaskRequestHost: mask}, nil
}

// GoneError is the ErrNotFound of a sandbox that existed in the last day:
// why it is gone, if it died, and whose it was (whom the reason, and its
// logs, may be shown to).
type GoneError struct {
	ID     string
	Reason string
	Team   string
}

func (e *GoneError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%v: %s: %s", ErrNotFound, e.ID, e.Reason)
	}
	return fmt.Sprintf("%v: %s", ErrNotFound, e.ID)
}

// Unwrap makes a GoneError an ErrNotFound.
func (e *GoneError) Unwrap() error { return ErrNotFound }

// NotFoundError is the ErrNotFound of an id nobody knows: what the API
// answers for another team's sandbox too, so that nothing tells the two
// apart.
func NotFoundError(id string) error { return fmt.Errorf("%w: %s", ErrNotFound, id) }

// notFound is the ErrNotFound for id, a GoneError if it existed lately.
func (c *Cluster) notFound(ctx context.Context, id string) error {
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	if t, ok := c.recs.whyGone(lctx, id); ok {
		return &GoneError{ID: id, Reason: t.Reason, Team: t.Team}
	}
	return NotFoundError(id)
}

// ListFilter selects sandboxes.
type ListFilter struct {
	// Metadata entries must all match.
	Metadata map[string]string
	// States, if not empty, must contain the sandbox's state.
	States []State
	// Teams, if not empty, must contain the sandbox's team.
	Teams []string
}

// List returns the sandboxes matching f, ordered by start time then id.
func (c *Cluster) List(f ListFilter) []*Sandbox {
	var out []*Sandbox
	for _, r := range c.recs.matching(func(r *record) bool { return f.match(&r.Sandbox) }) {
		sb := r.Sandbox
		out = append(out, &sb)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.Before(out[j].StartedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Count is how many sandboxes match f (List's length, without copies).
func (c *Cluster) Count(f ListFilter) int {
	n := 0
	c.recs.each(func(r *record) {
		if f.match(&r.Sandbox) {
			n++
		}
	})
	return n
}

func (f ListFilter) match(sb *Sandbox) bool {
	if len(f.Teams) > 0 && !slices.Contains(f.Teams, sb.TeamID()) {
		return false
	}
	for k, v := range f.Metadata {
		if got, ok := sb.Metadata[k]; !ok || got != v {
			return false
		}
	}
	if len(f.States) == 0 {
		return true
	}
	for _, s := range f.States {
		if s == sb.State {
			return true
		}
	}
	return false
}
