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
// reports each one's median.
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
		benchExec(b, tc.c)
	})
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
