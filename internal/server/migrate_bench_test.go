package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/testutil"
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
	testutil.RequireRoot(b)
	runsc := testutil.RequireBinary(b, "runsc", "AENV_RUNSC")
	base, binDir := os.Getenv("AENV_BASE_ROOTFS"), os.Getenv("AENV_BIN_DIR")
	if base == "" || binDir == "" {
		testutil.Unavailable(b, "AENV_BASE_ROOTFS and AENV_BIN_DIR must be set (make build base)")
	}
	ctx := context.Background()
	dir := b.TempDir()
	shared := filepath.Join(dir, "shared-store")
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	n := tagCounter.Add(1)
	nodeCfg := func(name string, i int32) Config {
		return Config{
			Listen: "127.0.0.1:0", NodeID: name, DataDir: filepath.Join(dir, name), RunDir: filepath.Join(dir, name+"-run"),
			RunscPath: runsc, EnvdPath: filepath.Join(binDir, "envd"), BaseRootFS: base,
			SandboxCIDR: fmt.Sprintf("10.23%d.0.0/16", 2+i%7), NetnsTag: "migb" + string(rune('a'+i%26)),
			NetnsPoolSize: 1, StoreURL: shared, OnStop: cluster.StopKill, Logger: log,
		}
	}
	cfgA := nodeCfg("migra", n)
	cfgA.EtcdClientURLs = []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(b))}
	srv, err := Start(ctx, cfgA)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close(context.Background())
	url := "http://" + srv.Addr().String()
	token, err := os.ReadFile(ClusterTokenPath(cfgA.DataDir))
	if err != nil {
		b.Fatal(err)
	}
	cfgB := nodeCfg("migrb", tagCounter.Add(1))
	cfgB.Join, cfgB.ClusterToken = url, strings.TrimSpace(string(token))
	agent, err := StartNode(ctx, cfgB)
	if err != nil {
		b.Fatal(err)
	}
	defer agent.Close(context.Background())
	c := client.New(url, srv.APIKey())
	deadline := time.Now().Add(15 * time.Second)
	for {
		nodes, err := c.Nodes(ctx)
		if err == nil && len(nodes) == 2 && nodes[0].State == "ready" && nodes[1].State == "ready" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the two nodes are not ready: %+v %v", nodes, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	sb := mustCreate(b, c, client.CreateOptions{Timeout: 1800})
	defer c.Kill(context.Background(), sb.SandboxID)
	runOut(b, c, sb.SandboxID, counterCmd)
	count := func(when string) int {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var out bytes.Buffer
		code, err := c.Run(rctx, sb.SandboxID, "cat /tmp/counter", client.RunOptions{Stdout: &out})
		n, aerr := strconv.Atoi(strings.TrimSpace(out.String()))
		if err != nil || code != 0 || aerr != nil {
			b.Fatalf("reading the counter %s: code %d, %v, %q", when, code, err, out.String())
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
