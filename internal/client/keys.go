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

// CreateKey makes an API key; maxSandboxes bounds its running sandboxes
// (0: no bound).
func (c *Client) CreateKey(ctx context.Context, name string, maxSandboxes int, admin bool) (*Key, error) {
	var out Key
	body := map[string]any{"name": name, "maxSandboxes": maxSandboxes, "admin": admin}
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
