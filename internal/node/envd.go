package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"time"
)

// envdClient is the node's side of the few plain-HTTP envd calls the
// platform makes itself (readiness and /init); users' traffic reaches envd
// through the proxy instead.
type envdClient struct {
	base  string
	token string
	http  *http.Client
}

func newEnvdClient(addr netip.Addr, token string) *envdClient {
	return &envdClient{
		base:  "http://" + net.JoinHostPort(addr.String(), strconv.Itoa(EnvdPort)),
		token: token,
		http: &http.Client{Transport: &http.Transport{
			// A fresh sandbox's address may be a recycled one: never reuse
			// a connection across sandboxes.
			DisableKeepAlives: true,
			DialContext:       (&net.Dialer{Timeout: time.Second}).DialContext,
		}},
	}
}

// waitReady polls /health until envd answers 204 or ctx ends. The poll is
// tight because it sits on the create path: envd is usually up within
// milliseconds of runsc returning.
func (c *envdClient) waitReady(ctx context.Context) error {
	const delay = 3 * time.Millisecond
	var lastErr error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/health", nil)
		resp, err := c.http.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("health answered %s", resp.Status)
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(delay):
		}
	}
}

// initRequest is envd's POST /init body.
type initRequest struct {
	EnvVars     map[string]string `json:"envVars,omitempty"`
	AccessToken string            `json:"accessToken,omitempty"`
	DefaultUser string            `json:"defaultUser,omitempty"`
	// DefaultWorkdir is where commands start when they name no cwd.
	DefaultWorkdir string    `json:"defaultWorkdir,omitempty"`
	Timestamp      time.Time `json:"timestamp"`
}

func (c *envdClient) init(ctx context.Context, body initRequest) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/init", bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("X-Access-Token", c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("envd /init answered %s", resp.Status)
	}
	return nil
}

// upload writes body to path in the sandbox as user, through envd's /files.
func (c *envdClient) upload(ctx context.Context, user, path string, body io.Reader) error {
	q := url.Values{"path": {path}, "username": {user}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/files?"+q.Encode(), body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	if c.token != "" {
		req.Header.Set("X-Access-Token", c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("uploading %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("uploading %s: envd answered %s: %s", path, resp.Status, msg)
	}
	return nil
}
