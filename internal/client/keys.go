package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Key is an API key as the server lists it.
type Key struct {
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	Hint         string    `json:"hint"`
	Team         string    `json:"team,omitempty"`
	Admin        bool      `json:"admin,omitempty"`
	MaxSandboxes int       `json:"maxSandboxes,omitempty"`
	CreatedAt    time.Time `json:"createdAt"`
	// Key is the key itself, only in CreateKey's answer.
	Key string `json:"key,omitempty"`
}

// Keys lists the cluster's API keys (an admin key's call).
func (c *Client) Keys(ctx context.Context) ([]Key, error) {
	out := []Key{}
	if err := c.do(ctx, http.MethodGet, "/keys", nil, &out); err != nil {
		return nil, fmt.Errorf("listing API keys: %w", err)
	}
	return out, nil
}

// KeyOptions describe a new API key.
type KeyOptions struct {
	// Team is the team the key joins (made if new); empty gives the key
	// a team of its own.
	Team string
	// MaxSandboxes bounds the key's own running sandboxes (0: no bound).
	MaxSandboxes int
	Admin        bool
}

// CreateKey makes an API key called name.
func (c *Client) CreateKey(ctx context.Context, name string, opts KeyOptions) (*Key, error) {
	var out Key
	body := map[string]any{"name": name, "team": opts.Team, "maxSandboxes": opts.MaxSandboxes, "admin": opts.Admin}
	if err := c.do(ctx, http.MethodPost, "/keys", body, &out); err != nil {
		return nil, fmt.Errorf("creating API key: %w", err)
	}
	return &out, nil
}

// RevokeKey removes an API key from the cluster.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/keys/"+url.PathEscape(id), nil, nil); err != nil {
		return fmt.Errorf("revoking API key %s: %w", id, err)
	}
	return nil
}

// Team is a team with its quota and what it uses.
type Team struct {
	ID               string    `json:"id"`
	CreatedAt        time.Time `json:"createdAt"`
	MaxSandboxes     int       `json:"maxSandboxes,omitempty"`
	MaxPaused        int       `json:"maxPaused,omitempty"`
	MaxBuilds        int       `json:"maxBuilds,omitempty"`
	MaxVolumeBytes   int64     `json:"maxVolumeBytes,omitempty"`
	MaxSnapshotBytes int64     `json:"maxSnapshotBytes,omitempty"`
	Usage            struct {
		Running       int   `json:"running"`
		Paused        int   `json:"paused"`
		Keys          int   `json:"keys"`
		SnapshotBytes int64 `json:"snapshotBytes"`
		Volumes       int   `json:"volumes"`
		VolumeBytes   int64 `json:"volumeBytes"`
	} `json:"usage"`
}

// TeamQuota changes a team's bounds: nil fields stay as they are, 0 is
// no bound.
type TeamQuota struct {
	MaxSandboxes     *int   `json:"maxSandboxes,omitempty"`
	MaxPaused        *int   `json:"maxPaused,omitempty"`
	MaxBuilds        *int   `json:"maxBuilds,omitempty"`
	MaxVolumeBytes   *int64 `json:"maxVolumeBytes,omitempty"`
	MaxSnapshotBytes *int64 `json:"maxSnapshotBytes,omitempty"`
}

// Teams lists the teams the key sees: every team for an admin key, its
// own otherwise.
func (c *Client) Teams(ctx context.Context) ([]Team, error) {
	out := []Team{}
	if err := c.do(ctx, http.MethodGet, "/teams", nil, &out); err != nil {
		return nil, fmt.Errorf("listing teams: %w", err)
	}
	return out, nil
}

// Team returns one team with its usage.
func (c *Client) Team(ctx context.Context, id string) (*Team, error) {
	var out Team
	if err := c.do(ctx, http.MethodGet, "/teams/"+url.PathEscape(id), nil, &out); err != nil {
		return nil, fmt.Errorf("reading team %s: %w", id, err)
	}
	return &out, nil
}

// CreateTeam makes a team (an admin key's call).
func (c *Client) CreateTeam(ctx context.Context, id string, q TeamQuota) (*Team, error) {
	body := struct {
		ID string `json:"id"`
		TeamQuota
	}{id, q}
	var out Team
	if err := c.do(ctx, http.MethodPost, "/teams", body, &out); err != nil {
		return nil, fmt.Errorf("creating team %s: %w", id, err)
	}
	return &out, nil
}

// SetTeam changes a team's quota (an admin key's call).
func (c *Client) SetTeam(ctx context.Context, id string, q TeamQuota) (*Team, error) {
	var out Team
	if err := c.do(ctx, http.MethodPatch, "/teams/"+url.PathEscape(id), q, &out); err != nil {
		return nil, fmt.Errorf("setting team %s: %w", id, err)
	}
	return &out, nil
}

// PublishTemplate makes a template visible, read-only, to every team, or
// private again (an admin key's call).
func (c *Client) PublishTemplate(ctx context.Context, id string, public bool) error {
	if err := c.do(ctx, http.MethodPatch, "/templates/"+url.PathEscape(id), map[string]bool{"public": public}, nil); err != nil {
		return fmt.Errorf("publishing template %s: %w", id, err)
	}
	return nil
}
