// Package s3gw runs a real S3 server for tests: versitygw (Apache-2.0)
// with its posix backend, built from the Go module proxy and run as its own
// process (its posix backend changes the working directory of the process
// it runs in). Only tests import it.
package s3gw

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/testutil"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Module is the versitygw release the tests run.
const Module = "github.com/versity/versitygw@v1.8.0"

// Build builds the gateway's main package inside its own module
// (with its own go.sum), so that its dependencies need not be ours. The
// first build takes minutes; the binary is then kept in the user's cache
// directory, keyed by module and Go version, so later runs start at once.
func Build(dir string) (string, error) {
	cacheDir, err := os.UserCacheDir()
	if err != nil {
		cacheDir = os.TempDir()
	}
	cacheDir = filepath.Join(cacheDir, "aenv-test")
	name := strings.NewReplacer("/", "_", "@", "-").Replace(Module) +
		"-" + runtime.Version() + "-" + runtime.GOOS + "-" + runtime.GOARCH
	cached := filepath.Join(cacheDir, name)
	if fi, err := os.Stat(cached); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o100 != 0 {
		return cached, nil
	}
	bin, err := compile(dir)
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

func compile(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dl := exec.Command(goBin, "mod", "download", "-json", Module)
	dl.Env = append(os.Environ(), "GOWORK=off")
	dl.Dir = dir
	var stderr bytes.Buffer
	dl.Stderr = &stderr
	out, err := dl.Output()
	if err != nil {
		return "", fmt.Errorf("go mod download %s: %w: %s", Module, err, stderr.String())
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s: no module directory (%v %s)", Module, err, mod.Error)
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

// Gateway is a running versitygw process.
type Gateway struct {
	// Bin and DataDir are what it runs and serves.
	Bin, DataDir string
	// Endpoint is its http://127.0.0.1:PORT URL; AccessKey and SecretKey
	// its credentials.
	Endpoint, AccessKey, SecretKey string
	// LogPath holds its output.
	LogPath string

	cmd  *exec.Cmd
	done <-chan struct{}
}

// Start runs versitygw over dataDir on a free loopback port and
// waits until it answers.
func Start(bin, dataDir string, readonly bool) (*Gateway, error) {
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, err
	}
	var lastErr error
	for range 3 { // the free port may be taken between probe and bind
		g, err := tryStart(bin, dataDir, readonly)
		if err == nil {
			return g, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

func tryStart(bin, dataDir string, readonly bool) (*Gateway, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	g := &Gateway{
		Bin:       bin,
		DataDir:   dataDir,
		Endpoint:  "http://" + addr,
		AccessKey: "aenvtest",
		SecretKey: "aenvtest-secret-" + fmt.Sprint(time.Now().UnixNano()),
		LogPath:   filepath.Join(filepath.Dir(dataDir), "versitygw-"+strings.ReplaceAll(addr, ":", "_")+".log"),
	}
	logf, err := os.Create(g.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	args := []string{"--access", g.AccessKey, "--secret", g.SecretKey, "--port", addr, "--health", "/health", "--quiet"}
	if readonly {
		args = append(args, "--readonly")
	}
	args = append(args, "posix", dataDir)
	g.cmd = exec.Command(bin, args...)
	g.cmd.Dir = dataDir
	g.cmd.Stdout, g.cmd.Stderr = logf, logf
	if g.done, err = testutil.StartTied(g.cmd); err != nil {
		return nil, fmt.Errorf("starting versitygw: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(g.Endpoint + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return g, nil
			}
		}
		select {
		case <-g.done:
			log, _ := os.ReadFile(g.LogPath)
			return nil, fmt.Errorf("versitygw exited before answering: %s", log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			g.Stop()
			log, _ := os.ReadFile(g.LogPath)
			return nil, fmt.Errorf("versitygw did not answer on %s within 30s: %s", g.Endpoint, log)
		}
	}
}

// Stop kills the gateway and waits for it.
func (g *Gateway) Stop() {
	g.cmd.Process.Kill()
	<-g.done
}

// CreateBucket creates bucket on the gateway.
func (g *Gateway) CreateBucket(ctx context.Context, bucket string) error {
	client := s3.New(s3.Options{
		BaseEndpoint: aws.String(g.Endpoint),
		Region:       "us-east-1",
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(g.AccessKey, g.SecretKey, ""),
	})
	if _, err := client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		return fmt.Errorf("creating bucket %s: %w", bucket, err)
	}
	return nil
}
