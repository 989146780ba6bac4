package server

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// BenchmarkExecHop measures a command's round trip (envd's process
// start, through the server's proxy, forwarded to a node agent) over the
// plain hop (HTTP and the cluster token) and over the mutual TLS one, and
// reports each one's median, and for mutual TLS the handshakes per
// command (near 0: the hop keeps its connections).
//
//	go test -run '^$' -bench ExecHop -benchtime 200x ./internal/server/
func BenchmarkExecHop(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		_, c := startWithAgent(b, "bhp", false)
		benchExec(b, c)
	})
	b.Run("mtls", func(b *testing.B) {
		tc := startTLSCluster(b, 0)
		tc.join(b, "bhtnode")
		before := tc.srv.trust.dials.Load()
		benchExec(b, tc.c)
		b.ReportMetric(float64(tc.srv.trust.dials.Load()-before)/float64(b.N), "tls-dials/op")
	})
}

// BenchmarkCreateHop measures create to first command (a create, a
// command, and the kill outside the timing) on a node agent over the
// plain hop and over the mutual TLS one, and reports each one's median:
// the bound is 5% more for mutual TLS.
//
//	go test -run '^$' -bench CreateHop -benchtime 40x ./internal/server/
func BenchmarkCreateHop(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		_, c := startWithAgent(b, "bcp", false)
		benchCreate(b, c)
	})
	b.Run("mtls", func(b *testing.B) {
		tc := startTLSCluster(b, 0)
		tc.join(b, "bctnode")
		benchCreate(b, tc.c)
	})
}

func benchCreate(b *testing.B, c *client.Client) {
	ctx := context.Background()
	once := func() time.Duration {
		start := time.Now()
		sb := mustCreate(b, c, client.CreateOptions{Timeout: 120})
		if code, err := c.Run(ctx, sb.SandboxID, "true", client.RunOptions{}); err != nil || code != 0 {
			b.Fatalf("exec: %d %v", code, err)
		}
		took := time.Since(start)
		if err := c.Kill(ctx, sb.SandboxID); err != nil {
			b.Fatal(err)
		}
		return took
	}
	for range 3 { // warm the node's pools and connections
		once()
	}
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		times = append(times, once())
	}
	b.StopTimer()
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(times[len(times)*9/10].Microseconds())/1000, "p90-ms")
}

func benchExec(b *testing.B, c *client.Client) {
	sb := mustCreate(b, c, client.CreateOptions{Timeout: 300})
	for range 5 { // warm the pools
		runWithin(b, c, sb.SandboxID, "true", 20*time.Second)
	}
	ctx := context.Background()
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if code, err := c.Run(ctx, sb.SandboxID, "true", client.RunOptions{}); err != nil || code != 0 {
			b.Fatalf("exec: %d %v", code, err)
		}
		times = append(times, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(times[len(times)*9/10].Microseconds())/1000, "p90-ms")
}
