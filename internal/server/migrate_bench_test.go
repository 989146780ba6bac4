package server

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
)

// migrateTargetMs is the downtime a small sandbox's migration may take,
// as a median.
const migrateTargetMs = 300

// BenchmarkMigrate moves a small sandbox (the base template, a counter
// running in it) back and forth between two nodes on this host, the
// server's own and a node agent that joined it, sharing a store. Each
// migration's downtime is the API's figure: from the start of the
// snapshot on one node to the end of the restore on the other. It reports
// the median and the slowest, and fails when the median is over the
// target of 300 ms. After every move the counter must have gone on.
//
//	make bench-migrate   # go test -run '^$' -bench '^BenchmarkMigrate$' -benchtime 10x ./internal/server/
func BenchmarkMigrate(b *testing.B) {
	_, c := startWithAgent(b, "migb", true)
	ctx := context.Background()
	sb := mustCreate(b, c, client.CreateOptions{Timeout: 1800})
	defer c.Kill(context.Background(), sb.SandboxID)
	runOut(b, c, sb.SandboxID, counterCmd)
	count := func(when string) int {
		n, err := strconv.Atoi(runWithin(b, c, sb.SandboxID, "cat /tmp/counter", 30*time.Second))
		if err != nil {
			b.Fatalf("reading the counter %s: %v", when, err)
		}
		return n
	}
	var downtimes []time.Duration
	for b.Loop() {
		b.StopTimer()
		before := count(fmt.Sprintf("before migration %d", len(downtimes)+1))
		b.StartTimer()
		mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		m, err := c.Migrate(mctx, sb.SandboxID, "")
		cancel()
		if err != nil {
			b.Fatalf("migration %d: %v", len(downtimes)+1, err)
		}
		b.StopTimer()
		if m.FromNodeID == m.NodeID {
			b.Fatalf("migration %d left the sandbox on node %s", len(downtimes)+1, m.NodeID)
		}
		downtimes = append(downtimes, time.Duration(m.DowntimeMs)*time.Millisecond)
		time.Sleep(200 * time.Millisecond)
		if after := count(fmt.Sprintf("after migration %d", len(downtimes))); after <= before {
			b.Fatalf("after migration %d (%s -> %s) the counter went from %d to %d: the sandbox did not carry on",
				len(downtimes), m.FromNodeID, m.NodeID, before, after)
		}
		b.StartTimer()
	}
	slices.Sort(downtimes)
	median := downtimes[len(downtimes)/2]
	b.ReportMetric(float64(median.Milliseconds()), "downtime-ms/op")
	b.ReportMetric(float64(downtimes[len(downtimes)-1].Milliseconds()), "max-downtime-ms/op")
	b.Logf("downtimes over %d migrations: %v (target: median <= %d ms)", len(downtimes), downtimes, migrateTargetMs)
	if median > migrateTargetMs*time.Millisecond {
		b.Errorf("median migration downtime %v is over the target of %d ms", median, migrateTargetMs)
	}
}
