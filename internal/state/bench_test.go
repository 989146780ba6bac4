package state

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkRecords100k sizes the embedded etcd for a busy host: 100,000
// sandbox records of about 400 bytes, each updated 10 times, then
// compacted. It reports what a full List costs (the API server's start and
// every watcher's re-List after ErrCompacted) and the backend bytes one
// record takes. Run with: go test -run '^$' -bench Records100k -benchtime 5x
func BenchmarkRecords100k(b *testing.B) {
	const (
		records = 100_000
		updates = 10
		// etcd's default --max-txn-ops.
		batch   = 128
		writers = 4
	)
	sock, err := os.MkdirTemp("/tmp", "aenv-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(sock)
	ctx := context.Background()
	e, err := Open(ctx, Config{DataDir: b.TempDir(), SocketDir: sock, Logger: slog.New(slog.DiscardHandler), OpTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	if err := e.WaitReady(ctx); err != nil {
		b.Fatal(err)
	}

	keys := make([]string, records)
	for i := range keys {
		keys[i] = "sandboxes/" + randomID(20)
	}
	start := time.Now()
	for round := range updates + 1 {
		if err := writeAll(ctx, e, keys, round, batch, writers); err != nil {
			b.Fatal(err)
		}
	}
	wrote := time.Since(start)
	st, err := e.Stats(ctx)
	if err != nil {
		b.Fatal(err)
	}
	before := st.DBSize
	if err := e.compact(ctx, st.Revision); err != nil {
		b.Fatal(err)
	}
	if st, err = e.Stats(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("record size %d bytes", len(record(keys[0], 0)))
	b.Logf("wrote %d records x %d versions in %s; db %d MB before compaction; after: db %d MB, in use %d MB, revision %d",
		records, updates+1, wrote.Round(time.Second), before>>20, st.DBSize>>20, st.DBSizeInUse>>20, st.Revision)

	var listed time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		es, _, err := e.List(ctx, "sandboxes/")
		listed += time.Since(t0)
		n++
		if err != nil {
			b.Fatal(err)
		}
		if len(es) != records {
			b.Fatalf("listed %d records, want %d", len(es), records)
		}
	}
	b.ReportMetric(float64(listed.Milliseconds())/float64(n), "ms/list")
	b.ReportMetric(float64(st.DBSizeInUse)/records, "inuse-B/record")
	b.ReportMetric(float64(st.DBSize)/records, "db-B/record")
	b.ReportMetric(wrote.Seconds(), "s-write")
}

// writeAll writes every key once (round 0 creates), in transactions of
// batch puts from several writers, so that etcd's fsyncs are shared.
func writeAll(ctx context.Context, e *Etcd, keys []string, round, batch, writers int) error {
	work := make(chan []string)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for ks := range work {
				ops := make([]clientv3.Op, len(ks))
				for i, k := range ks {
					ops[i] = clientv3.OpPut(e.prefix+k, string(record(k, round)))
				}
				if _, err := e.client.Txn(ctx).Then(ops...).Commit(); err != nil {
					errs <- fmt.Errorf("writing round %d: %w", round, err)
					return
				}
			}
		})
	}
	for i := 0; i < len(keys); i += batch {
		select {
		case work <- keys[i:min(i+batch, len(keys))]:
		case err := <-errs:
			close(work)
			wg.Wait()
			return err
		}
	}
	close(work)
	wg.Wait()
	close(errs)
	return <-errs
}

// record is a sandbox record as the cluster package might write it.
func record(key string, round int) []byte {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(round) * time.Minute)
	v, _ := json.Marshal(map[string]any{
		"id":          key[len("sandboxes/"):],
		"template_id": "tpl-python-3-12-" + key[len(key)-6:],
		"node_id":     "node-" + key[len(key)-3:],
		"state":       []string{"creating", "running", "paused", "resuming", "running"}[round%5],
		"version":     round,
		"created_at":  now.Add(-time.Hour).Format(time.RFC3339Nano),
		"updated_at":  now.Format(time.RFC3339Nano),
		"deadline":    now.Add(time.Hour).Format(time.RFC3339Nano),
		"cpu_count":   2,
		"memory_mb":   2048,
		"disk_mb":     10240,
		"ip":          "10.11.12.13",
		"metadata":    map[string]string{"user": "user-" + key[len(key)-8:], "purpose": "benchmark"},
		"env_vars":    map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin"},
		"snapshot":    "",
		"labels":      []string{"team-a", "ci"},
	})
	return v
}

func randomID(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

// compact discards history up to rev at once rather than at the next
// auto-compaction, so that benchmarks measure what live data costs.
func (e *Etcd) compact(ctx context.Context, rev int64) error {
	cctx, cancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
	defer cancel()
	if _, err := e.client.Compact(cctx, rev, clientv3.WithCompactPhysical()); err != nil {
		return e.wrap(fmt.Sprintf("compacting to revision %d", rev), err)
	}
	return nil
}
