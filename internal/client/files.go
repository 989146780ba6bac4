package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/envd/spec/filesystem"
	"github.com/aenvhq/aenv/internal/envd/spec/filesystem/filesystemconnect"
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

// Entry is a file, directory or symlink in a sandbox, as ListDir finds it.
type Entry struct {
	Name string `json:"name"`
	// Path is absolute.
	Path string `json:"path"`
	// Type is "file", "dir" or "symlink" ("" for anything else).
	Type string `json:"type"`
	Size int64  `json:"size"`
	// Permissions are as ls writes them: "-rw-r--r--".
	Permissions   string    `json:"permissions,omitempty"`
	Owner         string    `json:"owner,omitempty"`
	Group         string    `json:"group,omitempty"`
	ModifiedTime  time.Time `json:"modifiedTime,omitzero"`
	SymlinkTarget string    `json:"symlinkTarget,omitempty"`
}

var entryTypes = map[filesystem.FileType]string{
	filesystem.FileType_FILE_TYPE_FILE:      "file",
	filesystem.FileType_FILE_TYPE_DIRECTORY: "dir",
	filesystem.FileType_FILE_TYPE_SYMLINK:   "symlink",
}

// ListDir lists the directory remote in sandbox id (one level), through
// envd's filesystem service; a relative remote is from the user's home.
func (c *Client) ListDir(ctx context.Context, id, remote string, opts FileOptions) ([]Entry, error) {
	ropts := RunOptions{User: opts.User, AccessToken: c.token(id, opts.AccessToken)}
	svc := filesystemconnect.NewFilesystemClient(c.http, c.baseURL,
		connect.WithProtoJSON(),
		connect.WithInterceptors(headerInterceptor(id, ropts)))
	res, err := svc.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: remote, Depth: 1}))
	if err != nil {
		return nil, fmt.Errorf("listing %s in %s: %w", remote, id, err)
	}
	out := make([]Entry, 0, len(res.Msg.GetEntries()))
	for _, e := range res.Msg.GetEntries() {
		ent := Entry{
			Name: e.GetName(), Path: e.GetPath(), Type: entryTypes[e.GetType()], Size: e.GetSize(),
			Permissions: e.GetPermissions(), Owner: e.GetOwner(), Group: e.GetGroup(), SymlinkTarget: e.GetSymlinkTarget(),
		}
		if t := e.GetModifiedTime(); t != nil {
			ent.ModifiedTime = t.AsTime()
		}
		out = append(out, ent)
	}
	return out, nil
}
