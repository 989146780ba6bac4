package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// HTTPAPI is the SnapshotAPI of a server: sandboxes and commands go
// through *client.Client, the snapshot routes through plain HTTP requests
// made the way the E2B SDKs make them.
type HTTPAPI struct {
	*client.Client
	baseURL, key string
	http         *http.Client
}

var _ SnapshotAPI = (*HTTPAPI)(nil)

// NewHTTPAPI returns the SnapshotAPI of the server at baseURL.
func NewHTTPAPI(baseURL, key string) *HTTPAPI {
	return &HTTPAPI{
		Client:  client.New(baseURL, key),
		baseURL: strings.TrimRight(baseURL, "/"),
		key:     key,
		// Forks of many dirty children take a while; a stuck server must
		// still not hang the benchmark.
		http: &http.Client{Timeout: 10 * time.Minute},
	}
}

// call sends body as JSON and decodes a JSON answer into out (if not nil),
// demanding status want.
func (a *HTTPAPI) call(ctx context.Context, method, path string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.baseURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", a.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != want {
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &e) != nil || e.Message == "" {
			e.Message = strings.TrimSpace(string(b))
		}
		return fmt.Errorf("%s %s: HTTP %d, want %d: %s", method, path, resp.StatusCode, want, e.Message)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: decoding the answer: %w", method, path, err)
		}
	}
	return nil
}

func sandboxPath(id string) string { return "/sandboxes/" + url.PathEscape(id) }

// Snapshot implements SnapshotAPI.
func (a *HTTPAPI) Snapshot(ctx context.Context, id string) (SnapshotInfo, error) {
	var info SnapshotInfo
	if err := a.call(ctx, http.MethodPost, sandboxPath(id)+"/snapshots", struct{}{}, http.StatusCreated, &info); err != nil {
		return SnapshotInfo{}, fmt.Errorf("snapshotting sandbox %s: %w", id, err)
	}
	return info, nil
}

// DeleteSnapshot implements SnapshotAPI.
func (a *HTTPAPI) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if err := a.call(ctx, http.MethodDelete, "/templates/"+url.PathEscape(snapshotID), nil, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("deleting snapshot %s: %w", snapshotID, err)
	}
	return nil
}

// Pause implements SnapshotAPI.
func (a *HTTPAPI) Pause(ctx context.Context, id string) error {
	if err := a.call(ctx, http.MethodPost, sandboxPath(id)+"/pause", nil, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	return nil
}

// Resume implements SnapshotAPI: a connect, which answers 201 only when it
// resumed the sandbox.
func (a *HTTPAPI) Resume(ctx context.Context, id string, timeout int) error {
	body := map[string]int{"timeout": timeout}
	if err := a.call(ctx, http.MethodPost, "/v2"+sandboxPath(id)+"/connect", body, http.StatusCreated, nil); err != nil {
		return fmt.Errorf("resuming sandbox %s: %w", id, err)
	}
	return nil
}

// Fork implements SnapshotAPI.
func (a *HTTPAPI) Fork(ctx context.Context, id string, count, timeout int) ([]*client.Sandbox, error) {
	var results []struct {
		Sandbox *client.Sandbox `json:"sandbox"`
		Error   *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	body := map[string]int{"count": count, "timeout": timeout}
	if err := a.call(ctx, http.MethodPost, sandboxPath(id)+"/fork", body, http.StatusOK, &results); err != nil {
		return nil, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	var children []*client.Sandbox
	var errs []error
	for i, r := range results {
		switch {
		case r.Sandbox != nil:
			children = append(children, r.Sandbox)
		case r.Error != nil:
			errs = append(errs, fmt.Errorf("child %d: %s", i+1, r.Error.Message))
		default:
			errs = append(errs, fmt.Errorf("child %d: neither a sandbox nor an error", i+1))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return children, fmt.Errorf("forking sandbox %s: %w", id, err)
	}
	return children, nil
}
