package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// BatchResult is one sandbox of a batch: made (Sandbox), or not (Err,
// an *APIError with the reason).
type BatchResult struct {
	Index   int
	Sandbox *Sandbox
	Err     error
}

// CreateBatch creates count sandboxes of opts in one call (POST
// /sandboxes/batch), calling fn with each as soon as it is ready or has
// failed, in the order they end. It returns how many were made; an
// error only when the batch as a whole failed (fn has seen what was
// made before).
func (c *Client) CreateBatch(ctx context.Context, opts CreateOptions, count int, fn func(BatchResult)) (int, error) {
	body, err := batchBody(opts, count, false)
	if err != nil {
		return 0, err
	}
	resp, err := c.request(ctx, http.MethodPost, "/sandboxes/batch", bytes.NewReader(body), "application/json")
	if err != nil {
		return 0, fmt.Errorf("creating %d sandboxes: %w", count, err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	made := 0
	for sc.Scan() {
		var line struct {
			Index   int       `json:"index"`
			Sandbox *Sandbox  `json:"sandbox"`
			Error   *APIError `json:"error"`
			Done    bool      `json:"done"`
			Created int       `json:"created"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			return made, fmt.Errorf("creating %d sandboxes: decoding the server's answer: %w", count, err)
		}
		switch {
		case line.Done:
			return line.Created, nil
		case line.Sandbox != nil:
			made++
			c.remember(line.Sandbox)
			fn(BatchResult{Index: line.Index, Sandbox: line.Sandbox})
		case line.Error != nil:
			fn(BatchResult{Index: line.Index, Err: line.Error})
		}
	}
	if err := sc.Err(); err != nil {
		return made, fmt.Errorf("creating %d sandboxes: %w", count, err)
	}
	return made, fmt.Errorf("creating %d sandboxes: %w", count, errors.New("the server's answer ended early"))
}

// CreateAtomic creates count sandboxes of opts, all or none: on any
// failure the server removes those it made and the error says why.
func (c *Client) CreateAtomic(ctx context.Context, opts CreateOptions, count int) ([]Sandbox, error) {
	body, err := batchBody(opts, count, true)
	if err != nil {
		return nil, err
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	if err := c.do(ctx, http.MethodPost, "/sandboxes/batch", json.RawMessage(body), &out); err != nil {
		return nil, fmt.Errorf("creating %d sandboxes: %w", count, err)
	}
	for i := range out.Sandboxes {
		c.remember(&out.Sandboxes[i])
	}
	return out.Sandboxes, nil
}

// batchBody is opts with the batch's count and atomic, as the server
// reads them (a create's fields beside them).
func batchBody(opts CreateOptions, count int, atomic bool) ([]byte, error) {
	b, err := json.Marshal(opts)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["count"], m["atomic"] = count, atomic
	return json.Marshal(m)
}
