// Package client talks to an aenv server the way the E2B SDKs do: REST for
// the control plane and envd's Connect protocol (JSON codec) through the
// server's proxy for commands. The CLI and the benchmark use it; nothing in
// the server imports it.
package client

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
)

// Client is a connection to one aenv server. It is safe for concurrent use.
type Client struct {
	baseURL string
	apiKey  string
	http    *http.Client
}

// New returns a client for the server at baseURL (e.g. http://localhost:8000).
func New(baseURL, apiKey string) *Client {
	return &Client{
		baseURL: strings.TrimRight(baseURL, "/"),
		apiKey:  apiKey,
		http: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     30 * time.Second,
		}},
	}
}

// APIError is an error the server answered with.
type APIError struct {
	Status  int    `json:"code"`
	Message string `json:"message"`
}

func (e *APIError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

// Sandbox is the server's description of a sandbox.
type Sandbox struct {
	SandboxID       string            `json:"sandboxID"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	State           string            `json:"state"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	Domain          string            `json:"domain,omitempty"`
}

// CreateOptions describes a sandbox to create.
type CreateOptions struct {
	TemplateID string            `json:"templateID,omitempty"`
	Timeout    int               `json:"timeout,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	CPUCount   int               `json:"cpuCount,omitempty"`
	MemoryMB   int               `json:"memoryMB,omitempty"`
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("X-API-Key", c.apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		apiErr := &APIError{Status: resp.StatusCode}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, apiErr) != nil || apiErr.Message == "" {
			apiErr.Message = strings.TrimSpace(string(b))
		}
		apiErr.Status = resp.StatusCode
		return apiErr
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

// Create starts a sandbox.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, http.MethodPost, "/v2/sandboxes", opts, &sb); err != nil {
		return nil, fmt.Errorf("creating sandbox: %w", err)
	}
	return &sb, nil
}

// Get describes a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+id, nil, &sb); err != nil {
		return nil, fmt.Errorf("getting sandbox %s: %w", id, err)
	}
	return &sb, nil
}

// List returns the running sandboxes.
func (c *Client) List(ctx context.Context) ([]Sandbox, error) {
	var out []Sandbox
	if err := c.do(ctx, http.MethodGet, "/v2/sandboxes", nil, &out); err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	return out, nil
}

// Kill ends a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/sandboxes/"+id, nil, nil); err != nil {
		return fmt.Errorf("killing sandbox %s: %w", id, err)
	}
	return nil
}

// RunOptions configures Run.
type RunOptions struct {
	// Stdout and Stderr receive the command's output as it arrives.
	Stdout, Stderr io.Writer
	// User runs the command as this user (default: the sandbox's default).
	User string
	// Cwd and Envs set the working directory and extra environment.
	Cwd  string
	Envs map[string]string
	// AccessToken is the sandbox's envd token, if it has one.
	AccessToken string
}

// Process returns a Connect client for the process service of sandbox id,
// reached through the server's proxy.
func (c *Client) Process(id string, opts RunOptions) processconnect.ProcessClient {
	return processconnect.NewProcessClient(c.http, c.baseURL,
		connect.WithProtoJSON(),
		connect.WithInterceptors(headerInterceptor(id, opts)))
}

// Run runs cmd with `/bin/bash -l -c` in sandbox id, as the E2B SDKs do,
// streaming its output, and returns its exit code.
func (c *Client) Run(ctx context.Context, id, cmd string, opts RunOptions) (int, error) {
	stream, err := c.Process(id, opts).Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{
			Cmd:  "/bin/bash",
			Args: []string{"-l", "-c", cmd},
			Envs: opts.Envs,
			Cwd:  optional(opts.Cwd),
		},
	}))
	if err != nil {
		return -1, fmt.Errorf("running command in %s: %w", id, err)
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			if opts.Stdout != nil && len(d.GetStdout()) > 0 {
				opts.Stdout.Write(d.GetStdout())
			}
			if opts.Stderr != nil && len(d.GetStderr()) > 0 {
				opts.Stderr.Write(d.GetStderr())
			}
		}
		if end := ev.GetEnd(); end != nil {
			if e := end.GetError(); e != "" && !end.GetExited() {
				return -1, fmt.Errorf("running command in %s: %s", id, e)
			}
			return int(end.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, fmt.Errorf("running command in %s: %w", id, err)
	}
	return -1, errors.New("running command: stream ended without an exit status")
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// headerInterceptor adds the proxy's routing headers and envd's user and
// token headers to every call.
func headerInterceptor(id string, opts RunOptions) connect.Interceptor {
	set := func(h http.Header) {
		h.Set("E2b-Sandbox-Id", id)
		h.Set("E2b-Sandbox-Port", "49983")
		if opts.User != "" {
			h.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(opts.User+":")))
		}
		if opts.AccessToken != "" {
			h.Set("X-Access-Token", opts.AccessToken)
		}
	}
	return &interceptor{set: set}
}

type interceptor struct{ set func(http.Header) }

func (i *interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		i.set(req.Header())
		return next(ctx, req)
	}
}

func (i *interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		i.set(conn.RequestHeader())
		return conn
	}
}

func (i *interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}
