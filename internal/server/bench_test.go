package server

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/testutil"
)

// BenchmarkStartWith100kRecords measures what a large live state costs a
// restarting server: 100,000 simulated sandbox records in the embedded
// etcd (on other nodes, or paused, as in a cluster), each written 11 times
// and compacted, then the time from the server process's start to its
// first answered /health, and the etcd bytes one record takes.
//
//	go test -run '^$' -bench StartWith100kRecords -benchtime 5x ./internal/server/
func BenchmarkStartWith100kRecords(b *testing.B) {
	testutil.RequireRoot(b)
	testutil.RequireBinary(b, "runsc", "AENV_RUNSC")
	const records, updates = 100_000, 10
	dir := b.TempDir()
	dataDir, runDir := filepath.Join(dir, "data"), filepath.Join(dir, "run")
	ctx := context.Background()
	st, err := state.Open(ctx, state.Config{DataDir: filepath.Join(dataDir, "etcd"), SocketDir: runDir,
		Logger: slog.New(slog.DiscardHandler), OpTimeout: time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: st.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ids := make([]string, records)
	for i := range ids {
		ids[i] = benchID()
	}
	start := time.Now()
	var rev int64
	for round := range updates + 1 {
		if rev, err = writeRecords(ctx, cli, ids, round); err != nil {
			b.Fatal(err)
		}
	}
	wrote := time.Since(start)
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		b.Fatal(err)
	}
	stats, err := st.Stats(ctx)
	if err != nil {
		b.Fatal(err)
	}
	// Writing every version within seconds keeps all of them inside the
	// compaction window at once, which a live cluster never does; its
	// file stays near what is in use. Defragmenting gives that file.
	fileBefore := stats.DBSize
	if _, err := cli.Defragment(ctx, st.Endpoints()[0]); err != nil {
		b.Fatal(err)
	}
	if stats, err = st.Stats(ctx); err != nil {
		b.Fatal(err)
	}
	b.Logf("etcd file %d MB after writing, %d MB defragmented", fileBefore>>20, stats.DBSize>>20)
	cli.Close()
	st.Close()
	b.Logf("wrote %d records x %d versions in %s; after compaction etcd holds %d MB in use (file %d MB)",
		records, updates+1, wrote.Round(time.Second), stats.DBSizeInUse>>20, stats.DBSize>>20)

	var ready []time.Duration
	var last *serverProc
	for b.Loop() {
		last = startServerProc(b, dataDir, runDir)
		ready = append(ready, last.ready)
		last.stop(b, time.Minute)
	}
	b.Logf("the last start's log:\n%s", logWithout(last.log, "level=DEBUG"))
	slices.Sort(ready)
	b.ReportMetric(float64(ready[len(ready)/2].Milliseconds()), "ms-to-serving(p50)")
	b.ReportMetric(float64(stats.DBSizeInUse)/records, "etcd-B/record")
}

// writeRecords writes one version of every record, in transactions of
// etcd's default maximum of 128 operations from a few writers, and returns
// the store's revision after the last.
func writeRecords(ctx context.Context, cli *clientv3.Client, ids []string, round int) (int64, error) {
	const batch, writers = 128, 4
	work := make(chan []string)
	var (
		mu   sync.Mutex
		rev  int64
		werr error
		wg   sync.WaitGroup
	)
	for range writers {
		wg.Go(func() {
			for chunk := range work {
				ops := make([]clientv3.Op, len(chunk))
				for i, id := range chunk {
					ops[i] = clientv3.OpPut(state.DefaultPrefix+"sandboxes/"+id, string(benchRecord(id, round)))
				}
				resp, err := cli.Txn(ctx).Then(ops...).Commit()
				mu.Lock()
				if err != nil && werr == nil {
					werr = fmt.Errorf("writing round %d: %w", round, err)
				} else if err == nil {
					rev = max(rev, resp.Header.Revision)
				}
				mu.Unlock()
			}
		})
	}
	for i := 0; i < len(ids); i += batch {
		work <- ids[i:min(i+batch, len(ids))]
	}
	close(work)
	wg.Wait()
	return rev, werr
}

// benchRecord is a sandbox record as the cluster package stores it: half
// running on other nodes, half paused, with a little metadata.
func benchRecord(id string, round int) []byte {
	now := time.Now().UTC()
	rec := map[string]any{
		"id": id, "templateID": "base", "clientID": "node-" + id[:2], "nodeID": "node-" + id[:2],
		"metadata":  map[string]string{"user": "user-" + id[2:8], "run": fmt.Sprint(round)},
		"state":     "running",
		"startedAt": now.Add(-time.Hour), "endAt": now.Add(24 * time.Hour),
		"cpuCount": 2, "memoryMB": 512, "diskMB": 1024, "envdVersion": "0.6.4",
		"envdAccessToken": "8d2f6a0c1e9b4d7f3a5c8e0b2d4f6a8c1e3b5d7f9a0c2e4b",
		"addr":            "10.231.0.2",
	}
	if id[0] < 'n' {
		rec["state"], rec["snapshotID"], rec["addr"] = "paused", benchID(), ""
	}
	b, _ := json.Marshal(rec)
	return b
}

func benchID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}
