package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/aenvhq/aenv/internal/testutil/s3gw"
)

// The S3 tests run against a real S3 server: versitygw, run by s3gw.

// gw is the package's shared gateway, started by TestMain.
var gw *gateway

const testBucket = "aenv-test"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	tmp, err := os.MkdirTemp("", "aenv-store-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "store tests:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	bin, err := s3gw.Build(tmp)
	if err != nil {
		// Not a skip: the S3 half of this suite must never silently vanish.
		fmt.Fprintf(os.Stderr, "FAIL: store tests: building versitygw: %v\n", err)
		return 1
	}
	gw, err = startGateway(bin, filepath.Join(tmp, "s3"), false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: store tests: %v\n", err)
		return 1
	}
	defer gw.stop()
	if err := gw.createBucket(context.Background(), testBucket); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: store tests: %v\n", err)
		return 1
	}
	return m.Run()
}

// gateway adapts s3gw.Gateway to this package's tests.
type gateway struct {
	*s3gw.Gateway
	bin, dataDir, endpoint, access, secret string
}

func startGateway(bin, dataDir string, readonly bool) (*gateway, error) {
	g, err := s3gw.Start(bin, dataDir, readonly)
	if err != nil {
		return nil, err
	}
	return &gateway{Gateway: g, bin: g.Bin, dataDir: g.DataDir, endpoint: g.Endpoint, access: g.AccessKey, secret: g.SecretKey}, nil
}

func (g *gateway) stop() { g.Stop() }

func (g *gateway) config(prefix string) S3Config {
	return S3Config{
		Bucket:          testBucket,
		Prefix:          prefix,
		Endpoint:        g.endpoint,
		Region:          "us-east-1",
		PathStyle:       true,
		AccessKeyID:     g.access,
		SecretAccessKey: g.secret,
	}
}

func (g *gateway) createBucket(ctx context.Context, bucket string) error {
	b, err := NewS3(ctx, g.config(""))
	if err != nil {
		return err
	}
	_, err = b.client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	if err != nil {
		return fmt.Errorf("creating bucket %s: %w", bucket, err)
	}
	return nil
}

// newS3Backend returns a backend on the shared gateway under a prefix of
// its own, so tests do not see each other's objects.
func newS3Backend(t testing.TB) *S3 {
	t.Helper()
	prefix := fmt.Sprintf("%s-%d", strings.NewReplacer("/", "-", "#", "-").Replace(t.Name()), time.Now().UnixNano())
	b, err := NewS3(context.Background(), gw.config(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newLocalBackend(t testing.TB) *Local {
	t.Helper()
	b, err := NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// backends runs f once per Backend implementation. (Not in parallel: both
// halves are bound by the same disk's fsyncs, and contend.)
func backends(t *testing.T, f func(t *testing.T, b Backend)) {
	t.Run("local", func(t *testing.T) { f(t, newLocalBackend(t)) })
	t.Run("s3", func(t *testing.T) { f(t, newS3Backend(t)) })
}

var errInjected = errors.New("injected failure")
