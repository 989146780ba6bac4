package blockimage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Client talks to a node's image server.
type Client struct {
	socket string
	hc     *http.Client
}

// NewClient returns a client of the image server on socket (which may not
// run yet: see Start).
func NewClient(socket string) *Client {
	return &Client{socket: socket, hc: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}}
}

// StartOptions says how to start an image server when none runs.
type StartOptions struct {
	// Binary is the aenv binary; Args its arguments (`image-server ...`).
	Binary string
	Args   []string
	// Env is added to the server's environment (store credentials).
	Env []string
	// LogFile receives the server's log.
	LogFile string
}

// errNotRunning means no image server answers on the socket.
var errNotRunning = errors.New("no image server answers")

// startTimeout bounds waiting for a started image server to answer.
const startTimeout = 20 * time.Second

// Start makes sure an image server answers on the client's socket: the
// one a previous node process left (its mounts serve running sandboxes),
// or else a new one, started in its own session so that it outlives this
// process.
func (c *Client) Start(ctx context.Context, opts StartOptions) (Info, error) {
	if info, err := c.Info(ctx); err == nil {
		return info, nil
	}
	// One starter at a time for this socket.
	lock, err := os.OpenFile(c.socket+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return Info{}, fmt.Errorf("starting the image server: %w", err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return Info{}, fmt.Errorf("starting the image server: %w", err)
	}
	if info, err := c.Info(ctx); err == nil {
		return info, nil
	}
	if err := os.MkdirAll(filepath.Dir(opts.LogFile), 0o755); err != nil {
		return Info{}, fmt.Errorf("starting the image server: %w", err)
	}
	logf, err := os.OpenFile(opts.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return Info{}, fmt.Errorf("starting the image server: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(opts.Binary, opts.Args...)
	cmd.Env = append(os.Environ(), opts.Env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Info{}, fmt.Errorf("starting the image server %s: %w", opts.Binary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(startTimeout)
	for {
		if info, err := c.Info(ctx); err == nil {
			return info, nil
		}
		select {
		case err := <-exited:
			return Info{}, fmt.Errorf("starting the image server: it exited (%v); see %s", err, opts.LogFile)
		case <-deadline:
			cmd.Process.Kill()
			return Info{}, fmt.Errorf("starting the image server: no answer on %s after %v; see %s", c.socket, startTimeout, opts.LogFile)
		case <-ctx.Done():
			return Info{}, fmt.Errorf("starting the image server: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Info asks the server what it is and what it has mounted.
func (c *Client) Info(ctx context.Context) (Info, error) {
	var info Info
	err := c.call(ctx, http.MethodGet, "/v1/info", nil, &info)
	return info, err
}

// errNoCacheStats: the image server answers without its cache's figures
// (one of an aenv that did not report them).
var errNoCacheStats = errors.New("the image server reports no cache figures")

// CacheStats asks the server for its cache's figures.
func (c *Client) CacheStats(ctx context.Context) (CacheStats, error) {
	info, err := c.Info(ctx)
	if err != nil {
		return CacheStats{}, err
	}
	if info.Cache == nil {
		return CacheStats{}, errNoCacheStats
	}
	return *info.Cache, nil
}

// Acquire mounts src (if the node has not yet) for holder and returns its
// root filesystem's directory and the image's file (Mounted.File; empty
// from an image server that predates it).
func (c *Client) Acquire(ctx context.Context, src Source, holder string) (dir, file string, err error) {
	var resp acquireResponse
	if err := c.call(ctx, http.MethodPost, "/v1/acquire", acquireRequest{Source: src, Holder: holder}, &resp); err != nil {
		return "", "", err
	}
	return resp.Dir, resp.File, nil
}

// Release lets go of holder's image.
func (c *Client) Release(ctx context.Context, holder string) error {
	return c.call(ctx, http.MethodPost, "/v1/release", releaseRequest{Holder: holder}, nil)
}

// Sync releases every holder not in live and says how many it released.
func (c *Client) Sync(ctx context.Context, live []string) (int, error) {
	var resp syncResponse
	err := c.call(ctx, http.MethodPost, "/v1/sync", syncRequest{Live: live}, &resp)
	return resp.Released, err
}

// Shutdown asks the server to unmount everything and exit.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, "/v1/shutdown", nil, nil)
}

// Stop asks the server to unmount everything and exit, and waits until it
// has (the sandboxes using its images must be gone). No server: no-op.
func (c *Client) Stop(ctx context.Context) error {
	if err := c.Shutdown(ctx); err != nil {
		if errors.Is(err, errNotRunning) {
			return nil
		}
		return err
	}
	for {
		if _, err := c.Info(ctx); errors.Is(err, errNotRunning) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopping the image server: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Gather reads the server's metrics: a prometheus.Gatherer, so that the
// node's /metrics include them.
func (c *Client) Gather() ([]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://image-server/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading the image server's metrics: %w", err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the image server's metrics: %w", err)
	}
	out := make([]*dto.MetricFamily, 0, len(fams))
	for _, f := range fams {
		out = append(out, f)
	}
	return out, nil
}

// callTimeout bounds a call but acquire, which mounts (and may fetch).
const callTimeout = 10 * time.Second

func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	if path != "/v1/acquire" {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://image-server"+path, body)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("image server on %s: %w: %w", c.socket, errNotRunning, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e errorResponse
		json.NewDecoder(resp.Body).Decode(&e)
		return fmt.Errorf("image server: %s", e.Message)
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}
