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
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/server"
)

// servedMetrics are the metric families a running pure API server's
// /metrics serves (an embedded etcd, no local node: nothing privileged),
// and those the node's image server adds where a server has a local node
// (its collector's descriptions, which need no running image server).
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

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.Addr().String()+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+srv.APIKey())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	names := map[string]bool{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *prometheus.Desc, 32)
	go func() { (&blockimage.Server{}).Describe(ch); close(ch) }()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			names[m[1]] = true
		}
	}
	return names
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

// TestDashboardMetrics: every metric the dashboards query is one a server
// serves, so that no panel stays empty for a misspelt or a removed name
// (issue 20, item 4).
func TestDashboardMetrics(t *testing.T) {
	files, err := filepath.Glob("grafana/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in grafana/ (%v)", err)
	}
	served := servedMetrics(t)
	for _, want := range []string{"aenv_sandboxes", "aenv_image_cache_hits_total", "process_resident_memory_bytes"} {
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
		if !used["aenv_sandboxes"] {
			t.Errorf("%s: no panel of sandboxes by state (aenv_sandboxes)", f)
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
