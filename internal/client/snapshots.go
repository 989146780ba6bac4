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
	SnapshotID string    `json:"snapshotID"`
	Names      []string  `json:"names"`
	SandboxID  string    `json:"sandboxID,omitempty"`
	TemplateID string    `json:"templateID,omitempty"`
	CPUCount   int       `json:"cpuCount"`
	MemoryMB   int       `json:"memoryMB"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`
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

// ListSnapshots returns the snapshots users made, every page of them.
func (c *Client) ListSnapshots(ctx context.Context) ([]Snapshot, error) {
	var all []Snapshot
	next := ""
	for {
		path := "/snapshots?limit=100"
		if next != "" {
			path += "&nextToken=" + url.QueryEscape(next)
		}
		var page []Snapshot
		resp, err := c.doHeader(ctx, http.MethodGet, path, nil, &page)
		if err != nil {
			return nil, fmt.Errorf("listing snapshots: %w", err)
		}
		all = append(all, page...)
		next = resp.Header.Get("X-Next-Token")
		if next == "" || len(page) == 0 {
			return all, nil
		}
	}
}

// DeleteSnapshot deletes a snapshot by id or name.
func (c *Client) DeleteSnapshot(ctx context.Context, idOrName string) error {
	if err := c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(idOrName), nil, nil); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", idOrName, err)
	}
	return nil
}

// Metric is one sample of a sandbox's resource use.
type Metric struct {
	Timestamp  time.Time `json:"timestamp"`
	CPUCount   int       `json:"cpuCount"`
	CPUUsedPct float64   `json:"cpuUsedPct"`
	MemUsed    uint64    `json:"memUsed"`
	MemTotal   uint64    `json:"memTotal"`
	DiskUsed   uint64    `json:"diskUsed"`
	DiskTotal  uint64    `json:"diskTotal"`
}

// SandboxMetrics returns a sandbox's resource samples between start and
// end (zero: its whole life).
func (c *Client) SandboxMetrics(ctx context.Context, id string, start, end time.Time) ([]Metric, error) {
	q := url.Values{}
	if !start.IsZero() {
		q.Set("start", fmt.Sprint(start.Unix()))
	}
	if !end.IsZero() {
		q.Set("end", fmt.Sprint(end.Unix()))
	}
	path := "/sandboxes/" + url.PathEscape(id) + "/metrics"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var out []Metric
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, fmt.Errorf("reading metrics of sandbox %s: %w", id, err)
	}
	return out, nil
}

// LogEntry is one line of a sandbox's log.
type LogEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// Logs returns up to 1000 of a sandbox's log entries from cursor on
// (zero: its start), oldest first.
func (c *Client) Logs(ctx context.Context, id string, cursor time.Time) ([]LogEntry, error) {
	path := "/v2/sandboxes/" + url.PathEscape(id) + "/logs?limit=1000"
	if !cursor.IsZero() {
		path += "&cursor=" + fmt.Sprint(cursor.UnixMilli())
	}
	var out struct {
		Logs []LogEntry `json:"logs"`
	}
	if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, fmt.Errorf("reading logs of sandbox %s: %w", id, err)
	}
	return out.Logs, nil
}
