package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// envdPort is the port envd listens on inside every sandbox.
const envdPort = "49983"

// FileOptions configures Upload and Download.
type FileOptions struct {
	// User owns an uploaded file and resolves relative paths (default:
	// the sandbox's default user).
	User string
	// AccessToken is the sandbox's envd token, if it has one.
	AccessToken string
	// Size is the length of an upload, 0 when unknown.
	Size int64
}

// filesRequest builds a request for envd's /files route in sandbox id,
// sent through the server's proxy. The API key stays out of it: the
// request ends up inside the sandbox.
func (c *Client) filesRequest(ctx context.Context, method, id, remote string, body io.Reader, opts FileOptions) (*http.Request, error) {
	q := url.Values{"path": {remote}}
	if opts.User != "" {
		q.Set("username", opts.User)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+"/files?"+q.Encode(), body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", envdPort)
	if tok := c.token(id, opts.AccessToken); tok != "" {
		req.Header.Set("X-Access-Token", tok)
	}
	return req, nil
}

// Upload streams body into the file remote in sandbox id, creating it and
// its parent directories or truncating it.
func (c *Client) Upload(ctx context.Context, id, remote string, body io.Reader, opts FileOptions) error {
	req, err := c.filesRequest(ctx, http.MethodPost, id, remote, body, opts)
	if err != nil {
		return fmt.Errorf("uploading to %s in %s: %w", remote, id, err)
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if opts.Size > 0 {
		req.ContentLength = opts.Size
	}
	resp, err := c.send(req)
	if err != nil {
		return fmt.Errorf("uploading to %s in %s: %w", remote, id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("uploading to %s in %s: %w", remote, id, apiErrorFrom(resp))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	return nil
}

// Download opens the file remote in sandbox id for reading. size is its
// length, or -1 when the server did not say. The caller closes the
// reader.
func (c *Client) Download(ctx context.Context, id, remote string, opts FileOptions) (rc io.ReadCloser, size int64, err error) {
	req, err := c.filesRequest(ctx, http.MethodGet, id, remote, nil, opts)
	if err != nil {
		return nil, 0, fmt.Errorf("downloading %s from %s: %w", remote, id, err)
	}
	// Plain bytes keep the length known (for progress) and spare the CPU
	// on incompressible files.
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := c.send(req)
	if err != nil {
		return nil, 0, fmt.Errorf("downloading %s from %s: %w", remote, id, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, 0, fmt.Errorf("downloading %s from %s: %w", remote, id, apiErrorFrom(resp))
	}
	return resp.Body, resp.ContentLength, nil
}
