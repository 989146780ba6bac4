//go:build linux

package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/server"
)

// servedMetrics are the metric families a running pure API server's
// /metrics serves (an embedded etcd, no local node: nothing privileged),
// with the series names a histogram's family stands for (_bucket,
// _count, _sum); and the families whose series exist only with
// something to report, which the server has none of: the nodes' and the
// running sandboxes' (api.ClusterCollector), and what the node's image
// server adds where a server has a local node (blockimage.Server). Those
// come from their collectors' descriptions, the very Descs their Collect
// emits with (the api package's TestClusterMetrics has them emitted over
// nodes and a sandbox). That keeps this check unprivileged: a server
// with a node and a running sandbox to read them from would need runsc,
// network namespaces and a root filesystem, for names the collectors
// already say.
func servedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	dir := t.TempDir()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := server.Start(context.Background(), server.Config{NoLocalNode: true, Config: agent.Config{
		Listen: "127.0.0.1:0", DataDir: filepath.Join(dir, "data"), RunDir: filepath.Join(dir, "run"),
		OnStop: cluster.StopKill, Logger: log,
	}})
	if err != nil {
		t.Fatalf("starting a pure API server: %v", err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })

	names := map[string]bool{}
	// Twice: the answers' count has a series once an answer was counted
	// (the first GET /metrics, after it was written).
	for range 2 {
		readTypes(t, "http://"+srv.Addr().String()+"/metrics", srv.APIKey(), names)
	}
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		(&blockimage.Server{}).Describe(ch)
		api.NewClusterCollector(nil).Describe(ch)
		close(ch)
	}()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
}

// readTypes adds the families url's /metrics declares (its TYPE lines)
// to names, a histogram's and a summary's series names with them.
func readTypes(t *testing.T, url, key string, names map[string]bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || f[0] != "#" || f[1] != "TYPE" {
			continue
		}
		names[f[2]] = true
		switch f[3] {
		case "histogram":
			names[f[2]+"_bucket"], names[f[2]+"_count"], names[f[2]+"_sum"] = true, true, true
		case "summary":
			names[f[2]+"_count"], names[f[2]+"_sum"] = true, true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// queriesOf are the PromQL expressions of a dashboard: every "expr" of a
// panel's target, and every query of its template variables.
func queriesOf(t *testing.T, file string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "definition") {
					out = append(out, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	return out
}

// metricName finds the metric families a query names (aenv's own, the Go
// runtime's and the process's): a name followed by a selector, a range or
// the end of an argument.
var metricName = regexp.MustCompile(`\b((?:aenv|go|process)_[a-z0-9_]+)\b`)

// dashboards are the dashboards issue 20 asks for, each with metrics it
// must chart: the cluster overview (sandboxes by state, creates, errors,
// placement refusals), a node (capacity, use, pooled sandboxes, image
// cache) and one sandbox (CPU, memory, disk).
var dashboards = map[string][]string{
	"grafana/cluster.json": {"aenv_sandboxes", "aenv_sandbox_create_duration_seconds_count", "aenv_api_requests_total",
		"aenv_placement_refusals_total"},
	"grafana/node.json": {"aenv_node_cpus", "aenv_node_cpus_committed", "aenv_node_memory_bytes", "aenv_node_memory_committed_bytes",
		"aenv_node_pool_sandboxes", "aenv_node_image_cache_bytes", "aenv_node_image_cache_max_bytes", "aenv_node_image_cache_hits_total",
		"aenv_node_images_mounted"},
	"grafana/sandbox.json": {"aenv_sandbox_cpu_usage_ratio", "aenv_sandbox_memory_used_bytes", "aenv_sandbox_disk_used_bytes"},
}

// TestDashboardMetrics: every metric the dashboards query is one a server
// serves, so that no panel stays empty for a misspelt or a removed name
// (issue 20, item 4); and each dashboard charts what it is for.
func TestDashboardMetrics(t *testing.T) {
	files, err := filepath.Glob("grafana/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in grafana/ (%v)", err)
	}
	for f := range dashboards {
		if !slices.Contains(files, f) {
			t.Errorf("no dashboard %s", f)
		}
	}
	served := servedMetrics(t)
	for _, want := range []string{"aenv_sandboxes", "aenv_image_cache_hits_total", "process_resident_memory_bytes",
		"aenv_api_requests_total", "aenv_sandbox_create_duration_seconds_count", "aenv_placement_refusals_total",
		"aenv_node_image_cache_bytes", "aenv_sandbox_memory_used_bytes"} {
		if !served[want] {
			t.Fatalf("the server serves no %s: the check would prove nothing (served: %v)", want, keys(served))
		}
	}
	for _, f := range files {
		qs := queriesOf(t, f)
		if len(qs) == 0 {
			t.Errorf("%s: no queries", f)
		}
		used := map[string]bool{}
		for _, q := range qs {
			for _, m := range metricName.FindAllStringSubmatch(q, -1) {
				used[m[1]] = true
				if !served[m[1]] {
					t.Errorf("%s queries %s, which no server serves: %s", f, m[1], q)
				}
			}
		}
		for _, want := range dashboards[f] {
			if !used[want] {
				t.Errorf("%s charts no %s", f, want)
			}
		}
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
