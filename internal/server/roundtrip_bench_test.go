package server

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/node"
)

// BenchmarkRoundTrip takes a command's round trip apart, in one running
// sandbox, each sample of every variant in turn so that all see the same
// load: the SDK's command (`/bin/bash -l -c true`) through the server's
// proxy, the same straight to envd at the sandbox's address, then envd
// with a plain shell, with no shell, and last a bare `runsc exec
// /bin/true` into the same sandbox. The differences are the proxy hop,
// the login shell's profile, bash, and envd's spawn against runsc's.
//
//	go test -run '^$' -bench RoundTrip -benchtime 100x ./internal/server/
func BenchmarkRoundTrip(b *testing.B) {
	srv, c, _ := startServer(b)
	ctx := context.Background()
	sb := mustCreate(b, c, client.CreateOptions{Timeout: 600})
	route, err := srv.SandboxRoute(ctx, sb.SandboxID)
	if err != nil {
		b.Fatal(err)
	}
	direct := client.New("http://"+net.JoinHostPort(route.Addr.String(), strconv.Itoa(node.EnvdPort)), "")
	run := func(via *client.Client, cmd string, args ...string) func() error {
		return func() error {
			p, err := via.StartProcess(ctx, sb.SandboxID, client.ProcessOptions{Cmd: cmd, Args: args, AccessToken: sb.EnvdAccessToken})
			if err != nil {
				return err
			}
			_, err = p.Wait()
			return err
		}
	}
	runscRoot := filepath.Join(srv.cfg.RunDir, "gvisor", "runsc")
	variants := []struct {
		name string
		op   func() error
	}{
		{"api-bash-l", run(c, "/bin/bash", "-l", "-c", "true")},
		{"envd-bash-l", run(direct, "/bin/bash", "-l", "-c", "true")},
		{"envd-bash", run(direct, "/bin/bash", "-c", "true")},
		{"envd-true", run(direct, "/bin/true")},
		{"runsc-exec-true", func() error {
			return exec.CommandContext(ctx, srv.cfg.RunscPath, "--root", runscRoot, "exec", sb.SandboxID, "/bin/true").Run()
		}},
	}
	for range 3 { // connections, page cache
		for _, v := range variants {
			if err := v.op(); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
		}
	}
	times := make([][]time.Duration, len(variants))
	b.ResetTimer()
	for range b.N {
		for i, v := range variants {
			start := time.Now()
			if err := v.op(); err != nil {
				b.Fatalf("%s: %v", v.name, err)
			}
			times[i] = append(times[i], time.Since(start))
		}
	}
	b.StopTimer()
	for i, v := range variants {
		slices.Sort(times[i])
		b.ReportMetric(float64(times[i][len(times[i])/2].Microseconds())/1000, v.name+"-ms")
	}
}
