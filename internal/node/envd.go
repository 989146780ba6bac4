package node

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
)

// envdClient is the node's side of the few plain-HTTP envd calls the
// platform makes itself (readiness and /init); users' traffic reaches envd
// through the proxy instead.
type envdClient struct {
	base  string
	token string
	http  *http.Client
	// servingEvery is how far apart waitReady polls while it waits for
	// envd's notice: envdServingPoll, but in tests.
	servingEvery time.Duration
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
		servingEvery: envdServingPoll,
	}
}

// envdServingPoll is how far apart waitReady polls while it waits for
// envd's notice that it serves: the polls only guard against a notice that
// never comes.
const envdServingPoll = 25 * time.Millisecond

// waitReady polls /health until envd answers 204 or ctx ends. The poll is
// tight because it sits on the create path: envd is usually up within
// milliseconds of runsc returning. With serving (runtime.EnvdWatcher),
// after a first poll it waits for that channel to close before polling
// tightly, and until then polls only every envdServingPoll: a refused poll
// costs the sandbox's network stack host CPU that its boot wants (on 2
// CPUs, 10 creates at once each waited 20-190 ms for envd, up to 60
// polls). The first poll is sent at once all the same: an envd that
// serves before the driver has read its line answers it.
func (c *envdClient) waitReady(ctx context.Context, serving <-chan struct{}) error {
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
		d := delay
		if serving != nil {
			d = c.servingEvery
		}
		wait := time.NewTimer(d)
		select {
		case <-serving:
			serving = nil
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			if serving != nil {
				return fmt.Errorf("%w (envd has not said it serves; last error: %v)", ctx.Err(), lastErr)
			}
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		}
		wait.Stop()
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
	// DropAccessToken makes envd demand no token any more.
	DropAccessToken bool `json:"dropAccessToken,omitempty"`
}

func (c *envdClient) init(ctx context.Context, body initRequest) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	// envd answered /health already, but on a host busy with a burst of
	// boots the sentry can leave a connection unanswered for longer than
	// a dial's second (50 boots at once on 2 cores did, once in 50). A
	// request that never connected was never sent: dial again while ctx
	// lasts.
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/init", bytes.NewReader(b))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		if c.token != "" {
			req.Header.Set("X-Access-Token", c.token)
		}
		resp, err := c.http.Do(req)
		if isDialError(err) {
			// A refused dial fails at once: do not spin on it.
			select {
			case <-ctx.Done():
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
			case <-time.After(10 * time.Millisecond):
				continue
			}
		}
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("envd /init answered %s", resp.Status)
		}
		return nil
	}
}

// isDialError reports whether err is a failure to connect, before any of
// the request was written.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
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

// processClient runs the node's own commands in a sandbox through envd's
// process API.
type processClient struct {
	c     processconnect.ProcessClient
	token string
}

// withToken makes p send envd's access token (a sandbox handed out has
// one).
func (p *processClient) withToken(token string) *processClient {
	p.token = token
	return p
}

func newProcessClient(sb *Sandbox) *processClient {
	e := newEnvdClient(sb.Addr, "")
	return &processClient{c: processconnect.NewProcessClient(e.http, e.base)}
}

// run runs cmd with bash as the sandbox's default user. It returns the
// exit code and the start of the output; with background it returns as
// soon as the command has run for a moment (code -1), leaving it running,
// unless it ended by then.
func (p *processClient) run(ctx context.Context, cmd string, background bool) (int, string, error) {
	return p.runAs(ctx, "", cmd, background)
}

// runAs is run as user (empty: the sandbox's default user).
func (p *processClient) runAs(ctx context.Context, user, cmd string, background bool) (int, string, error) {
	if background {
		// envd kills a process when its request's deadline passes: a
		// service's request has none, and is cut off by hand instead.
		ctx = context.WithoutCancel(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sreq := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}},
	})
	if user != "" {
		sreq.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	if p.token != "" {
		sreq.Header().Set("X-Access-Token", p.token)
	}
	stream, err := p.c.Start(ctx, sreq)
	if err != nil {
		return -1, "", err
	}
	events := make(chan *process.ProcessEvent)
	go func() {
		defer close(events)
		defer stream.Close()
		for stream.Receive() {
			select {
			case events <- stream.Msg().GetEvent():
			case <-ctx.Done():
				return
			}
		}
	}()
	var out []byte
	var settle <-chan time.Time
	if background {
		settle = time.After(30 * time.Second) // until it starts
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				if err := stream.Err(); err != nil {
					return -1, string(out), err
				}
				return -1, string(out), errors.New("the process stream ended without an exit status")
			}
			switch {
			case ev.GetStart() != nil && background:
				// A command that fails at once (not found, bad flags)
				// says so in this moment; one that runs on is the service.
				settle = time.After(300 * time.Millisecond)
			case ev.GetData() != nil:
				if len(out) < 4096 {
					out = append(out, ev.GetData().GetStdout()...)
					out = append(out, ev.GetData().GetStderr()...)
				}
			case ev.GetEnd() != nil:
				return int(ev.GetEnd().GetExitCode()), string(out), nil
			}
		case <-settle:
			return -1, string(out), nil
		}
	}
}
