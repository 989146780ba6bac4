package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// DefaultCPUCount and DefaultMemoryMB are the resources a server gives a
// pulled or built template's sandboxes when ImportOptions names none
// (image.DefaultCPUCount and DefaultMemoryMB, which a test keeps equal),
// for the CLI to show without linking the server's image package.
const (
	DefaultCPUCount = 2
	DefaultMemoryMB = 512
)

// ImportOptions are what a pulled or built template records.
type ImportOptions struct {
	// Name is the template to create or replace (required).
	Name string
	// CPUCount and MemoryMB are its sandboxes' default resources (0: the
	// server's defaults).
	CPUCount, MemoryMB int
	// StartCmd and ReadyCmd are recorded with the template.
	StartCmd, ReadyCmd string
	// Insecure allows plain HTTP and unverified TLS to the registry.
	Insecure bool
}

func (o ImportOptions) query() url.Values {
	q := url.Values{"name": {o.Name}}
	if o.CPUCount > 0 {
		q.Set("cpuCount", strconv.Itoa(o.CPUCount))
	}
	if o.MemoryMB > 0 {
		q.Set("memoryMB", strconv.Itoa(o.MemoryMB))
	}
	if o.StartCmd != "" {
		q.Set("startCmd", o.StartCmd)
	}
	if o.ReadyCmd != "" {
		q.Set("readyCmd", o.ReadyCmd)
	}
	if o.Insecure {
		q.Set("insecure", "true")
	}
	return q
}

// PullSource says where the image of a pull is.
type PullSource struct {
	// Ref is a registry reference, or (with Body) the image to pick in an
	// upload.
	Ref string
	// Format is "oci" (Body is a tar of an OCI layout directory) or
	// "docker-archive" (Body is a `docker save` tarball); empty pulls Ref
	// from a registry.
	Format string
	Body   io.Reader
}

// PullProgress is one step of a pull on the server.
type PullProgress struct {
	Layer        int    `json:"layer"`
	Layers       int    `json:"layers"`
	Digest       string `json:"digest"`
	Fetched      int64  `json:"fetched"`
	Applied      int64  `json:"applied"`
	Total        int64  `json:"total"`
	Unpacked     bool   `json:"unpacked"`
	ImageFetched int64  `json:"imageFetched"`
	ImageApplied int64  `json:"imageApplied"`
	ImageTotal   int64  `json:"imageTotal"`
}

// ImportResult describes a published template.
type ImportResult struct {
	TemplateID string `json:"templateID"`
	Digest     string `json:"digest"`
	Layers     int    `json:"layers"`
	Bytes      int64  `json:"bytes"`
	DurationMs int64  `json:"durationMs"`
}

// ImportError is a pull or build that failed on the server; nothing was
// published. ExitCode is a failed RUN step's.
type ImportError struct {
	APIError
	ExitCode int `json:"exitCode"`
}

// ImportEvents receives what the server reports while it works; nil
// fields are ignored.
type ImportEvents struct {
	Progress func(PullProgress)
	Log      func(line string)
}

type importEvent struct {
	Progress *PullProgress `json:"progress"`
	Log      *string       `json:"log"`
	Done     *ImportResult `json:"done"`
	Error    *ImportError  `json:"error"`
}

// PullTemplate makes the server pull an image into template opts.Name.
func (c *Client) PullTemplate(ctx context.Context, src PullSource, opts ImportOptions, ev ImportEvents) (*ImportResult, error) {
	q := opts.query()
	if src.Ref != "" {
		q.Set("ref", src.Ref)
	}
	if src.Format != "" {
		q.Set("source", src.Format)
	}
	res, err := c.importStream(ctx, "/templates/pulls", q, src.Body, ev)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", opts.Name, err)
	}
	return res, nil
}

// BuildOptions describe a Dockerfile build beyond ImportOptions.
type BuildOptions struct {
	ImportOptions
	// Dockerfile is its path in the context (default Dockerfile).
	Dockerfile string
	// BuildArgs set declared ARGs.
	BuildArgs map[string]string
}

// BuildTemplate makes the server build template opts.Name from the build
// context in contextTar (a tar stream holding the Dockerfile).
func (c *Client) BuildTemplate(ctx context.Context, contextTar io.Reader, opts BuildOptions, ev ImportEvents) (*ImportResult, error) {
	q := opts.query()
	if opts.Dockerfile != "" {
		q.Set("dockerfile", opts.Dockerfile)
	}
	for k, v := range opts.BuildArgs {
		q.Add("buildArg", k+"="+v)
	}
	res, err := c.importStream(ctx, "/templates/builds", q, contextTar, ev)
	if err != nil {
		return nil, fmt.Errorf("building %s: %w", opts.Name, err)
	}
	return res, nil
}

// importStream posts body and follows the server's event stream to its
// end.
func (c *Client) importStream(ctx context.Context, path string, q url.Values, body io.Reader, ev ImportEvents) (*ImportResult, error) {
	contentType := ""
	if body != nil {
		contentType = "application/x-tar"
	}
	resp, err := c.request(ctx, http.MethodPost, path+"?"+q.Encode(), body, contentType)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e importEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("decoding the server's progress: %w", err)
		}
		switch {
		case e.Progress != nil && ev.Progress != nil:
			ev.Progress(*e.Progress)
		case e.Log != nil && ev.Log != nil:
			ev.Log(*e.Log)
		case e.Done != nil:
			return e.Done, nil
		case e.Error != nil:
			return nil, e.Error
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the server's progress: %w", err)
	}
	return nil, errors.New("the server ended the stream without saying how the import went")
}

// Error implements error.
func (e *ImportError) Error() string { return e.APIError.Error() }
