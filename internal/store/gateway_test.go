package store

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// The S3 tests run against a real S3 server: versitygw (Apache-2.0) with
// its posix backend. It chdirs into its data directory, so it runs as a
// separate process, built here from the module cache.
const versitygwModule = "github.com/versity/versitygw@v1.8.0"

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
	bin, err := buildVersityGW(tmp)
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

// buildVersityGW builds the gateway's main package inside its own module
// (with its own go.sum), so that its dependencies need not be ours. The
// first build takes minutes; the binary is then kept in the user's cache
// directory, keyed by module and Go version, so later runs start at once.
func buildVersityGW(dir string) (string, error) {
	cacheDir, err := os.UserCacheDir()
	if err != nil {
		cacheDir = os.TempDir()
	}
	cacheDir = filepath.Join(cacheDir, "aenv-test")
	name := strings.NewReplacer("/", "_", "@", "-").Replace(versitygwModule) +
		"-" + runtime.Version() + "-" + runtime.GOOS + "-" + runtime.GOARCH
	cached := filepath.Join(cacheDir, name)
	if fi, err := os.Stat(cached); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o100 != 0 {
		return cached, nil
	}
	bin, err := compileVersityGW(dir)
	if err != nil {
		return "", err
	}
	// Publish by rename so a concurrent run never sees half a binary.
	if os.MkdirAll(cacheDir, 0o755) == nil {
		if tmp, err := os.CreateTemp(cacheDir, ".build-*"); err == nil {
			data, rerr := os.ReadFile(bin)
			_, werr := tmp.Write(data)
			tmp.Close()
			if rerr == nil && werr == nil && os.Chmod(tmp.Name(), 0o755) == nil && os.Rename(tmp.Name(), cached) == nil {
				return cached, nil
			}
			os.Remove(tmp.Name())
		}
	}
	return bin, nil
}

func compileVersityGW(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dl := exec.Command(goBin, "mod", "download", "-json", versitygwModule)
	dl.Env = append(os.Environ(), "GOWORK=off")
	dl.Dir = dir
	var stderr bytes.Buffer
	dl.Stderr = &stderr
	out, err := dl.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w: %s", versitygwModule, err, stderr.String())
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s: no module directory (%v %s)", versitygwModule, err, mod.Error)
	}
	bin := filepath.Join(dir, "versitygw")
	build := exec.Command(goBin, "build", "-o", bin, "./cmd/versitygw")
	build.Dir = mod.Dir
	build.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false", "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/versitygw in %s: %w\n%s", mod.Dir, err, out)
	}
	return bin, nil
}

type gateway struct {
	bin      string
	dataDir  string
	cmd      *exec.Cmd
	endpoint string
	access   string
	secret   string
	logPath  string
	done     chan struct{}
}

// startGateway runs versitygw over dataDir on a free loopback port and
// waits until it answers.
func startGateway(bin, dataDir string, readonly bool) (*gateway, error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // the free port may be taken between probe and bind
		g, err := tryStartGateway(bin, dataDir, readonly)
		if err == nil {
			return g, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func tryStartGateway(bin, dataDir string, readonly bool) (*gateway, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	g := &gateway{
		bin:      bin,
		dataDir:  dataDir,
		endpoint: "http://" + addr,
		access:   "aenvtest",
		secret:   "aenvtest-secret-" + fmt.Sprint(time.Now().UnixNano()),
		logPath:  filepath.Join(filepath.Dir(dataDir), "versitygw-"+strings.ReplaceAll(addr, ":", "_")+".log"),
		done:     make(chan struct{}),
	}
	logf, err := os.Create(g.logPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	args := []string{"--access", g.access, "--secret", g.secret, "--port", addr, "--health", "/health", "--quiet"}
	if readonly {
		args = append(args, "--readonly")
	}
	args = append(args, "posix", dataDir)
	g.cmd = exec.Command(bin, args...)
	g.cmd.Dir = dataDir
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	setPdeathsig(g.cmd)
	if err := g.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting versitygw: %w", err)
	}
	go func() { g.cmd.Wait(); close(g.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(g.endpoint + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return g, nil
			}
		}
		select {
		case <-g.done:
			log, _ := os.ReadFile(g.logPath)
			return nil, fmt.Errorf("versitygw exited before answering: %s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			g.stop()
			log, _ := os.ReadFile(g.logPath)
			return nil, fmt.Errorf("versitygw did not answer on %s within 30s: %s", g.endpoint, log)
		}
	}
}

func (g *gateway) stop() {
	g.cmd.Process.Kill()
	<-g.done
}

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
