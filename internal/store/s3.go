package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// maxSinglePut is S3's limit for one PutObject. Snapshot chunks and
// manifests are far smaller; a larger object would need multipart upload.
const maxSinglePut = 5 << 30

// S3Config locates a bucket and says how to reach it.
type S3Config struct {
	Bucket string
	// Prefix is prepended (with a slash) to every key, so that several
	// stores can share a bucket.
	Prefix string
	// Endpoint is the server's base URL for S3-compatible servers; empty
	// means AWS.
	Endpoint string
	// Region defaults to the AWS default chain's region, else us-east-1.
	Region string
	// PathStyle addresses buckets as endpoint/bucket instead of
	// bucket.endpoint; most self-hosted servers need it.
	PathStyle bool
	// AccessKeyID and SecretAccessKey are static credentials; when both are
	// empty the AWS default credential chain is used.
	AccessKeyID     string
	SecretAccessKey string
	SessionToken    string
	// HTTPClient overrides the SDK's HTTP client (nil: the SDK's default).
	HTTPClient *http.Client
}

// S3 is a Backend on an S3 bucket (AWS or any S3-compatible server).
type S3 struct {
	client *s3.Client
	bucket string
	prefix string // "" or ends with "/"
}

// NewS3 returns a backend for cfg. It does not contact the server.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("opening S3 store: missing bucket")
	}
	var loadOpts []func(*config.LoadOptions) error
	if cfg.Region != "" {
		loadOpts = append(loadOpts, config.WithRegion(cfg.Region))
	}
	if cfg.AccessKeyID != "" || cfg.SecretAccessKey != "" {
		if cfg.AccessKeyID == "" || cfg.SecretAccessKey == "" {
			return nil, fmt.Errorf("opening S3 store s3://%s: need both an access key id and a secret key", cfg.Bucket)
		}
		loadOpts = append(loadOpts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKeyID, cfg.SecretAccessKey, cfg.SessionToken)))
	}
	if cfg.HTTPClient != nil {
		loadOpts = append(loadOpts, config.WithHTTPClient(cfg.HTTPClient))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("opening S3 store s3://%s: loading AWS config: %w", cfg.Bucket, err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		// The Store verifies a sha256 of every chunk itself; asking for the
		// SDK's extra CRC trailers only breaks S3-compatible servers that
		// do not implement them.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	p := strings.Trim(cfg.Prefix, "/")
	if p != "" {
		if err := validKey(p); err != nil {
			return nil, fmt.Errorf("opening S3 store s3://%s: prefix: %w", cfg.Bucket, err)
		}
		p += "/"
	}
	return &S3{client: client, bucket: cfg.Bucket, prefix: p}, nil
}

// String implements Backend.
func (s *S3) String() string { return "s3://" + path.Join(s.bucket, s.prefix) }

func (s *S3) key(key string) (string, error) {
	if err := validKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// Put implements Backend.
func (s *S3) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	k, err := s.key(key)
	if err != nil {
		return fmt.Errorf("putting %s: %w", key, err)
	}
	if size < 0 || size > maxSinglePut {
		return fmt.Errorf("putting %s in %s: size %d out of range", key, s, size)
	}
	body, ok := r.(io.ReadSeeker)
	if !ok {
		// Signing over plain HTTP and retrying both need to read the body
		// twice; spool a one-shot reader to a temporary file.
		f, err := spool(ctx, r, size)
		if err != nil {
			return fmt.Errorf("putting %s in %s: %w", key, s, err)
		}
		defer f.Close()
		body = f
	} else if err := checkRemaining(body, size); err != nil {
		// A reader of the wrong length would otherwise be stored cut short
		// or fail with an opaque transport error.
		return fmt.Errorf("putting %s in %s: %w", key, s, err)
	}
	_, err = s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           aws.String(k),
		Body:          body,
		ContentLength: aws.Int64(size),
	})
	if err != nil {
		return fmt.Errorf("putting %s in %s: %w", key, s, mapS3Err(err))
	}
	return nil
}

// Get implements Backend.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	k, err := s.key(key)
	if err != nil {
		return nil, fmt.Errorf("getting %s: %w", key, err)
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(k)})
	if err != nil {
		return nil, fmt.Errorf("getting %s from %s: %w", key, s, mapS3Err(err))
	}
	return out.Body, nil
}

// Stat implements Backend.
func (s *S3) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	k, err := s.key(key)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("statting %s: %w", key, err)
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(k)})
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("statting %s in %s: %w", key, s, mapS3Err(err))
	}
	return ObjectInfo{Key: key, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified)}, nil
}

// Delete implements Backend.
func (s *S3) Delete(ctx context.Context, key string) error {
	k, err := s.key(key)
	if err != nil {
		return fmt.Errorf("deleting %s: %w", key, err)
	}
	_, err = s.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: aws.String(s.bucket), Key: aws.String(k)})
	if err != nil && !errors.Is(mapS3Err(err), ErrNotFound) {
		return fmt.Errorf("deleting %s from %s: %w", key, s, mapS3Err(err))
	}
	return nil
}

// List implements Backend.
func (s *S3) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	p := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(s.prefix + prefix),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("listing %q in %s: %w", prefix, s, mapS3Err(err))
		}
		for _, o := range page.Contents {
			k := strings.TrimPrefix(aws.ToString(o.Key), s.prefix)
			if strings.HasSuffix(k, "/") { // a "directory" marker some servers keep
				continue
			}
			out = append(out, ObjectInfo{Key: k, Size: aws.ToInt64(o.Size), ModTime: aws.ToTime(o.LastModified)})
		}
	}
	return out, nil
}

// mapS3Err turns S3's "no such key" answers into ErrNotFound, keeping the
// original error in the chain for its message (AccessDenied etc. pass
// through unchanged and are printed with the server's code).
func mapS3Err(err error) error {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode() {
		case "NoSuchKey", "NotFound":
			return fmt.Errorf("%w: %w", ErrNotFound, err)
		}
	}
	var respErr *awshttp.ResponseError
	if errors.As(err, &respErr) && respErr.HTTPStatusCode() == http.StatusNotFound {
		if apiErr == nil || apiErr.ErrorCode() != "NoSuchBucket" {
			return fmt.Errorf("%w: %w", ErrNotFound, err)
		}
	}
	return err
}

// spool copies exactly size bytes of r into an unlinked temporary file.
func spool(ctx context.Context, r io.Reader, size int64) (*os.File, error) {
	f, err := os.CreateTemp("", "aenv-store-spool-*")
	if err != nil {
		return nil, err
	}
	os.Remove(f.Name())
	n, err := io.Copy(f, io.LimitReader(ctxReader{ctx, r}, size+1))
	if err == nil && n != size {
		err = fmt.Errorf("reader gave %d bytes, want %d", n, size)
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// checkRemaining verifies that rs holds exactly size bytes from its current
// position, leaving the position where it was.
func checkRemaining(rs io.ReadSeeker, size int64) error {
	cur, err := rs.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	end, err := rs.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if _, err := rs.Seek(cur, io.SeekStart); err != nil {
		return err
	}
	if end-cur != size {
		return fmt.Errorf("reader holds %d bytes, want %d", end-cur, size)
	}
	return nil
}
