package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/aenvhq/aenv/internal/state"
)

// BenchmarkPlacement is the scheduler at scale against a real (embedded)
// etcd: 1,000 nodes registered under leases, each reporting every few
// seconds as node agents do, and 100,000 sandbox records. It measures
// choosing a node (placement alone, from the fleet's cache) and a whole
// create against fake nodes (placement, the node's answer, the record's
// write to etcd), and reports the load the nodes' reports put on etcd.
// TestPlacementAtScale asserts the figures (placement p99 <= 5 ms, the
// spread) over the in-memory store; this adds etcd's.
//
//	go test -run '^$' -bench Placement -benchtime 20000x ./internal/cluster/
func BenchmarkPlacement(b *testing.B) {
	const nodeCount, records = 1000, 100_000
	ctx := context.Background()
	dir := b.TempDir()
	log := slog.New(slog.DiscardHandler)
	st, err := state.Open(ctx, state.Config{DataDir: filepath.Join(dir, "etcd"), SocketDir: dir, Logger: log, OpTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() }) // after the cluster and the registrations, which clean up first

	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range records {
		g.Go(func() error {
			r := record{Sandbox: Sandbox{Spec: Spec{MemoryMB: 512, CPUCount: 2, Metadata: map[string]string{"run": "bench", "step": fmt.Sprint(i)}}, ID: fmt.Sprintf("rec%07d", i), TemplateID: "base", NodeID: fmt.Sprintf("node%04d", i%nodeCount), State: StateRunning, StartedAt: time.Now().UTC(), EndAt: time.Now().Add(time.Hour).UTC()}}
			v, err := encodeRecord(nil, &r)
			if err != nil {
				return err
			}
			_, err = st.Put(gctx, sandboxKey(r.ID), v, state.WriteOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	wrote := time.Since(start)

	start = time.Now()
	c, _ := scaleFleet(b, st, nodeCount)
	registered := time.Since(start)
	b.Logf("registered and opened %d nodes in %s, wrote %d records in %s", nodeCount, registered.Round(time.Millisecond), records, wrote.Round(time.Second))

	var place []time.Duration
	p := placement{template: "base", memoryMB: 512, cpus: 1}
	for b.Loop() {
		t0 := time.Now()
		if _, err := c.nodes.place(p); err != nil {
			b.Fatal(err)
		}
		place = append(place, time.Since(t0))
	}
	var creates []time.Duration
	for range 2000 {
		t0 := time.Now()
		if _, err := c.Create(ctx, CreateRequest{Spec: Spec{Timeout: time.Hour}, TemplateID: "base"}); err != nil {
			b.Fatal(err)
		}
		creates = append(creates, time.Since(t0))
	}
	// The etcd load of a cluster at rest: the nodes' reports.
	before, err := st.Stats(ctx)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(10 * time.Second)
	after, err := st.Stats(ctx)
	if err != nil {
		b.Fatal(err)
	}
	writes := float64(after.Revision-before.Revision) / 10
	pct := func(d []time.Duration, q float64) float64 { return float64(quantile(d, q).Microseconds()) }
	b.ReportMetric(pct(place, 0.5), "place-µs(p50)")
	b.ReportMetric(pct(place, 0.99), "place-µs(p99)")
	b.ReportMetric(pct(creates, 0.5), "create-µs(p50)")
	b.ReportMetric(pct(creates, 0.99), "create-µs(p99)")
	b.ReportMetric(writes, "etcd-writes/s")
	b.ReportMetric(float64(after.DBSizeInUse>>20), "etcd-MB")
}
