package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ErrNotFound classifies a key, snapshot or bucket object that does not exist.
var ErrNotFound = errors.New("not found")

// ObjectInfo describes one stored object.
type ObjectInfo struct {
	// Key is relative to the backend's root (its directory or bucket prefix).
	Key  string
	Size int64
	// ModTime is when the object was last written; GC uses it to spare
	// chunks that a Save in flight has uploaded but not yet referenced.
	ModTime time.Time
}

// Backend is a flat object store. Keys are slash-separated relative paths
// (no empty, "." or ".." segments, no segment starting with "."). Every Put
// is atomic: a reader sees the whole object or nothing, never a prefix.
type Backend interface {
	// Put stores exactly size bytes read from r under key, replacing any
	// previous object. If r yields fewer or more bytes, nothing is stored.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens the object for reading; ErrNotFound if it does not exist.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat describes the object; ErrNotFound if it does not exist.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// Delete removes the object. Deleting a missing object is not an error,
	// as in S3, so that retried deletes and concurrent GCs are harmless.
	Delete(ctx context.Context, key string) error
	// List returns every object whose key starts with prefix (a plain string
	// prefix, as in S3), sorted by key.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// String names the backend in errors and logs (no credentials).
	String() string
}

// Exists reports whether key is stored in b.
func Exists(ctx context.Context, b Backend, key string) (bool, error) {
	_, err := b.Stat(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// validKey rejects keys that could escape a backend's root or collide with
// the local backend's temporary files.
func validKey(key string) error {
	if key == "" {
		return errors.New("empty key")
	}
	for seg := range strings.SplitSeq(key, "/") {
		if seg == "" || seg == "." || seg == ".." || strings.HasPrefix(seg, ".") {
			return fmt.Errorf("invalid key %q", key)
		}
		if strings.ContainsRune(seg, 0) || strings.ContainsRune(seg, '\\') {
			return fmt.Errorf("invalid key %q", key)
		}
	}
	return nil
}

// OpenOptions carries what a store URL cannot, or should not, hold.
type OpenOptions struct {
	// AccessKeyID and SecretAccessKey are static S3 credentials (from flags).
	// When empty, the URL's access_key/secret_key parameters (meant for
	// tests) are used, and failing those the AWS default chain (the
	// AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY environment variables, shared
	// config files, instance roles).
	AccessKeyID     string
	SecretAccessKey string
}

// Open returns the backend that a store URL names:
//
//	/abs/path                      local (or shared) directory
//	file:///abs/path               the same
//	s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1&path_style=true
//
// S3 query parameters: endpoint, region, path_style (bool), and for tests
// only access_key and secret_key.
func Open(ctx context.Context, rawURL string, opts OpenOptions) (Backend, error) {
	if strings.HasPrefix(rawURL, "/") {
		return NewLocal(rawURL)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("parsing store URL: %w", err)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("parsing store URL %q: file URLs must not name a host", rawURL)
		}
		if !filepath.IsAbs(u.Path) {
			return nil, fmt.Errorf("parsing store URL %q: path must be absolute", rawURL)
		}
		return NewLocal(u.Path)
	case "s3":
		cfg, err := parseS3URL(u)
		if err != nil {
			return nil, fmt.Errorf("parsing store URL %q: %w", redactURL(u), err)
		}
		if opts.AccessKeyID != "" || opts.SecretAccessKey != "" {
			cfg.AccessKeyID, cfg.SecretAccessKey = opts.AccessKeyID, opts.SecretAccessKey
		}
		return NewS3(ctx, cfg)
	default:
		return nil, fmt.Errorf("parsing store URL %q: unsupported scheme %q (want an absolute path, file:// or s3://)", redactURL(u), u.Scheme)
	}
}

func parseS3URL(u *url.URL) (S3Config, error) {
	cfg := S3Config{
		Bucket: u.Host,
		Prefix: strings.Trim(u.Path, "/"),
	}
	if cfg.Bucket == "" {
		return cfg, errors.New("missing bucket")
	}
	q := u.Query()
	for k := range q {
		switch k {
		case "endpoint", "region", "path_style", "access_key", "secret_key":
		default:
			return cfg, fmt.Errorf("unknown parameter %q", k)
		}
	}
	cfg.Endpoint = q.Get("endpoint")
	cfg.Region = q.Get("region")
	if v := q.Get("path_style"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return cfg, fmt.Errorf("path_style: %w", err)
		}
		cfg.PathStyle = b
	}
	cfg.AccessKeyID = q.Get("access_key")
	cfg.SecretAccessKey = q.Get("secret_key")
	return cfg, nil
}

// redactURL hides a secret passed in the query so it never reaches a log.
func redactURL(u *url.URL) string {
	c := *u
	q := c.Query()
	if q.Has("secret_key") {
		q.Set("secret_key", "REDACTED")
		c.RawQuery = q.Encode()
	}
	return c.String()
}
