package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Snapshot is the server's description of a snapshot.
type Snapshot struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
	SizeBytes  int64    `json:"sizeBytes"`
	CPUCount   int      `json:"cpuCount"`
	MemoryMB   int      `json:"memoryMB"`
}

// Snapshot saves a running sandbox, which keeps running; name, if not
// empty, is a name the snapshot can be used by as a template.
func (c *Client) Snapshot(ctx context.Context, id, name string) (*Snapshot, error) {
	body := struct {
		Name string `json:"name,omitempty"`
	}{name}
	var s Snapshot
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/snapshots", body, &s); err != nil {
		return nil, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	return &s, nil
}

// ForkResult is one child of a fork: a sandbox, or why it did not start.
type ForkResult struct {
	Sandbox *Sandbox
	Err     error
}

// Fork starts count independent copies of a running sandbox, each alive
// for timeout. Children that failed carry their error.
func (c *Client) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	body := map[string]int64{"count": int64(count), "timeout": int64(timeout / time.Second)}
	var answer []struct {
		Sandbox *Sandbox  `json:"sandbox"`
		Error   *APIError `json:"error"`
	}
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/fork", body, &answer); err != nil {
		return nil, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	out := make([]ForkResult, len(answer))
	for i, a := range answer {
		switch {
		case a.Sandbox != nil:
			out[i].Sandbox = a.Sandbox
			c.remember(a.Sandbox)
		case a.Error != nil:
			out[i].Err = a.Error
		default:
			out[i].Err = fmt.Errorf("neither a sandbox nor an error")
		}
	}
	return out, nil
}
