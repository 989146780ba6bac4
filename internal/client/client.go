// Package client talks to an aenv server the way the E2B SDKs do: REST for
// the control plane and envd's Connect protocol (JSON codec) through the
// server's proxy for commands. The CLI and the benchmark use it, and so
// does the web console, which calls its own server's handler in process
// (NewWithTransport); nothing else in the server imports it.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
)

// Client is a connection to one aenv server. It is safe for concurrent use.
type Client struct {
	baseURL string
	apiKey  string
	http    *http.Client
	// tokens holds the envd access tokens of the sandboxes this client
	// created or looked up (id to token), sent with their envd calls
	// unless the call names its own, as the SDKs do.
	tokens *sync.Map
}

// New returns a client for the server at baseURL (e.g. http://localhost:8000).
func New(baseURL, apiKey string) *Client {
	c, _ := NewWithCA(baseURL, apiKey, nil)
	return c
}

// NewWithCA is New for a server whose certificate is signed by the CA in
// caPEM (a cluster's own, which `aenv cluster ca` prints) as well as by
// the system's roots; nil caPEM trusts the system's roots only.
func NewWithCA(baseURL, apiKey string, caPEM []byte) (*Client, error) {
	tr := &http.Transport{
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
	}
	if len(caPEM) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("reading the server's CA: no PEM certificate in it")
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &Client{
		tokens:  &sync.Map{},
		baseURL: strings.TrimRight(baseURL, "/"),
		apiKey:  apiKey,
		http:    &http.Client{Transport: tr},
	}, nil
}

// NewWithTransport is New over rt instead of the network: the web
// console hands it one that calls the server's own handler in process.
func NewWithTransport(baseURL, apiKey string, rt http.RoundTripper) *Client {
	return &Client{
		tokens:  &sync.Map{},
		baseURL: strings.TrimRight(baseURL, "/"),
		apiKey:  apiKey,
		http:    &http.Client{Transport: rt},
	}
}

// APIError is an error the server answered with.
type APIError struct {
	Status  int    `json:"code"`
	Message string `json:"message"`
}

func (e *APIError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = http.StatusText(e.Status)
	}
	return fmt.Sprintf("%s (HTTP %d)", msg, e.Status)
}

// IsStatus reports whether err is, or wraps, an APIError with that status.
func IsStatus(err error, status int) bool {
	var apiErr *APIError
	return errors.As(err, &apiErr) && apiErr.Status == status
}

// apiErrorFrom reads an error response: E2B's {code, message} JSON, or
// else the body as text.
func apiErrorFrom(resp *http.Response) *APIError {
	apiErr := &APIError{}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, apiErr) != nil || apiErr.Message == "" {
		apiErr.Message = strings.TrimSpace(string(b))
	}
	apiErr.Status = resp.StatusCode
	return apiErr
}

// send performs req, turning a failure to reach the server into an error
// that names it.
func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		if ctxErr := req.Context().Err(); ctxErr != nil {
			return nil, ctxErr
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("cannot reach the server at %s: %w", c.baseURL, err)
	}
	return resp, nil
}

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
	// NodeID is the node the sandbox runs on (an aenv extension).
	NodeID string `json:"nodeID,omitempty"`
	// IdlePaused: the server paused it for being idle, and its next
	// request resumes it (an aenv extension).
	IdlePaused bool `json:"idlePaused,omitempty"`
}

// CreateOptions describes a sandbox to create.
type CreateOptions struct {
	TemplateID string            `json:"templateID,omitempty"`
	Timeout    int               `json:"timeout,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	CPUCount   int               `json:"cpuCount,omitempty"`
	MemoryMB   int               `json:"memoryMB,omitempty"`
	// Secure makes envd demand the sandbox's access token
	// (Sandbox.EnvdAccessToken) on every call.
	Secure bool `json:"secure,omitempty"`
	// VolumeMounts mount volumes (by name) at paths.
	VolumeMounts []VolumeMount `json:"volumeMounts,omitempty"`
	// Network holds egress rules.
	Network *Network `json:"network,omitempty"`
}

// Network is a sandbox's egress rules: AllowOut (CIDRs, addresses,
// domains with *. wildcards) wins over DenyOut (CIDRs, addresses).
type Network struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

// VolumeMount mounts volume Name at Path.
type VolumeMount struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	_, err := c.doHeader(ctx, method, path, body, out)
	return err
}

// doHeader is do that also returns the response's status and headers.
func (c *Client) doHeader(ctx context.Context, method, path string, body, out any) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	contentType := ""
	if body != nil {
		contentType = "application/json"
	}
	resp, err := c.request(ctx, method, path, rd, contentType)
	if err != nil {
		return resp, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp, fmt.Errorf("decoding the server's answer: %w", err)
		}
	}
	return resp, nil
}

// URL is the server's base URL.
func (c *Client) URL() string { return c.baseURL }

// Create starts a sandbox.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, http.MethodPost, "/v2/sandboxes", opts, &sb); err != nil {
		return nil, fmt.Errorf("creating sandbox: %w", err)
	}
	c.remember(&sb)
	return &sb, nil
}

// remember keeps sb's envd token for later envd calls.
func (c *Client) remember(sb *Sandbox) {
	if sb != nil && sb.EnvdAccessToken != "" {
		c.tokens.Store(sb.SandboxID, sb.EnvdAccessToken)
	}
}

// token is explicit, or else the remembered token of sandbox id.
func (c *Client) token(id, explicit string) string {
	if explicit != "" {
		return explicit
	}
	if t, ok := c.tokens.Load(id); ok {
		return t.(string)
	}
	return ""
}

// Get describes a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	if err := c.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil, &sb); err != nil {
		return nil, fmt.Errorf("getting sandbox %s: %w", id, err)
	}
	c.remember(&sb)
	return &sb, nil
}

// List returns the running sandboxes.
func (c *Client) List(ctx context.Context) ([]Sandbox, error) {
	return c.ListWith(ctx, ListOptions{})
}

// ListOptions filters a list of sandboxes.
type ListOptions struct {
	// Metadata keeps sandboxes whose metadata has all these pairs.
	Metadata map[string]string
	// States keeps sandboxes in one of these states (running, paused);
	// empty means the server's default.
	States []string
}

// ListWith returns the sandboxes that match opts, following the server's
// pages to the end.
func (c *Client) ListWith(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	q := url.Values{}
	if len(opts.Metadata) > 0 {
		md := url.Values{}
		for k, v := range opts.Metadata {
			md.Set(k, v)
		}
		q.Set("metadata", md.Encode())
	}
	if len(opts.States) > 0 {
		q.Set("state", strings.Join(opts.States, ","))
	}
	out := []Sandbox{}
	for {
		var page []Sandbox
		path := "/v2/sandboxes"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		resp, err := c.doHeader(ctx, http.MethodGet, path, nil, &page)
		if err != nil {
			return nil, fmt.Errorf("listing sandboxes: %w", err)
		}
		out = append(out, page...)
		next := resp.Header.Get("X-Next-Token")
		if next == "" || len(page) == 0 {
			return out, nil
		}
		q.Set("nextToken", next)
	}
}

// CheckKey asks the server for one sandbox, which needs a valid key: a
// 401 APIError means the key is wrong.
func (c *Client) CheckKey(ctx context.Context) error {
	var page []Sandbox
	if err := c.do(ctx, http.MethodGet, "/v2/sandboxes?limit=1", nil, &page); err != nil {
		return fmt.Errorf("checking the API key: %w", err)
	}
	return nil
}

// SetTimeout sets a sandbox to be killed timeout from now.
func (c *Client) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	body := map[string]int64{"timeout": int64(timeout / time.Second)}
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout", body, nil); err != nil {
		return fmt.Errorf("setting the timeout of sandbox %s: %w", id, err)
	}
	return nil
}

// Refresh keeps a sandbox alive for at least d from now; it never shortens
// its life.
func (c *Client) Refresh(ctx context.Context, id string, d time.Duration) error {
	body := map[string]int64{"duration": int64(d / time.Second)}
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/refreshes", body, nil); err != nil {
		return fmt.Errorf("refreshing sandbox %s: %w", id, err)
	}
	return nil
}

// Connect makes sure a sandbox runs, resuming it when it is paused, and
// keeps it alive for at least timeout. resumed reports whether it was
// paused.
func (c *Client) Connect(ctx context.Context, id string, timeout time.Duration) (sb *Sandbox, resumed bool, err error) {
	sb = &Sandbox{}
	body := map[string]int64{"timeout": int64(timeout / time.Second)}
	resp, err := c.doHeader(ctx, http.MethodPost, "/v2/sandboxes/"+url.PathEscape(id)+"/connect", body, sb)
	if err != nil {
		return nil, false, fmt.Errorf("connecting to sandbox %s: %w", id, err)
	}
	c.remember(sb)
	return sb, resp.StatusCode == http.StatusCreated, nil
}

// Pause pauses a sandbox.
func (c *Client) Pause(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/pause", nil, nil); err != nil {
		return fmt.Errorf("pausing sandbox %s: %w", id, err)
	}
	return nil
}

// Kill ends a sandbox.
func (c *Client) Kill(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil, nil); err != nil {
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
	opts.AccessToken = c.token(id, opts.AccessToken)
	return processconnect.NewProcessClient(c.http, c.baseURL,
		connect.WithProtoJSON(),
		connect.WithInterceptors(headerInterceptor(id, opts)))
}

// Run runs cmd with `/bin/bash -l -c` in sandbox id, as the E2B SDKs do,
// streaming its output, and returns its exit code. A process killed by a
// signal is an error. ctx's deadline, if any, bounds the command: envd
// kills it when it passes.
func (c *Client) Run(ctx context.Context, id, cmd string, opts RunOptions) (int, error) {
	p, err := c.StartProcess(ctx, id, ProcessOptions{
		Cmd:         "/bin/bash",
		Args:        []string{"-l", "-c", cmd},
		Envs:        opts.Envs,
		Cwd:         opts.Cwd,
		User:        opts.User,
		AccessToken: opts.AccessToken,
		Stdout:      opts.Stdout,
		Stderr:      opts.Stderr,
	})
	if err != nil {
		return -1, fmt.Errorf("running command in %s: %w", id, err)
	}
	st, err := p.Wait()
	if err != nil {
		return -1, fmt.Errorf("running command in %s: %w", id, err)
	}
	if !st.Exited {
		return -1, fmt.Errorf("running command in %s: %s", id, st.Status)
	}
	return st.Code, nil
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
		conn.RequestHeader().Set("Keepalive-Ping-Interval", keepaliveSeconds)
		return conn
	}
}

func (i *interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// request sends an authenticated request; a non-2xx answer becomes an
// *APIError (with the response, its body consumed and closed).
func (c *Client) request(ctx context.Context, method, path string, body io.Reader, contentType string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-API-Key", c.apiKey)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		return resp, apiErrorFrom(resp)
	}
	return resp, nil
}
