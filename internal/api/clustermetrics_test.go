package api_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/template"
)

// TestClusterMetrics: a pure API server's /metrics covers the cluster. Its
// nodes' reports (capacity, use, warm pool, image cache) are there by
// node; each running sandbox's last sample is there while it runs and
// gone once it is killed; creates are timed by outcome, placement
// refusals counted by cause, and answers by route and status.
func TestClusterMetrics(t *testing.T) {
	ctx := context.Background()
	st := state.NewMemory()
	n1, n2 := nodetest.NewFake("n1"), nodetest.NewFake("n2")
	n1.SetImageCache(&nodev1.ImageCache{Bytes: 3 << 20, MaxBytes: 10 << 20, Hits: 90, Misses: 10, Evictions: 2, Mounted: 1})
	n2.SetPooled(1)
	byAddr := map[string]nodeapi.Node{}
	for _, n := range []*nodetest.Fake{n1, n2} {
		byAddr["addr-"+n.ID()] = n
		reg, err := membership.RegisterNode(ctx, st, membership.Reporter(n, "addr-"+n.ID()), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(reg.Stop)
	}
	c, err := cluster.Open(ctx, cluster.Config{State: st, Candidate: "api", Dial: func(_, addr string) nodeapi.Node { return byAddr[addr] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(ctx, cluster.StopKeep) })
	dir := t.TempDir()
	tpls, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(dir, "templates"),
		Builtins: []*template.Template{{ID: template.BaseID, CPUCount: 1, MemoryMB: 256, RootFS: dir}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Cluster: c, Templates: tpls, APIKey: "k", AllowInsecure: true}))
	defer srv.Close()

	call := func(method, path, body string) int {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// Creates before the fleet has seen the nodes fail, and count.
	early := 0
	deadline := time.Now().Add(5 * time.Second)
	for call(http.MethodPost, "/sandboxes", `{"templateID":"base"}`) != http.StatusCreated {
		if time.Now().After(deadline) {
			t.Fatal("no create succeeded: the nodes were not seen")
		}
		early++
		time.Sleep(20 * time.Millisecond)
	}
	sbs := c.List(cluster.ListFilter{})
	if len(sbs) != 1 {
		t.Fatalf("%d sandboxes, want 1", len(sbs))
	}
	running := sbs[0]
	if code := call(http.MethodGet, "/sandboxes/nosuch", ""); code != http.StatusNotFound {
		t.Fatalf("GET of an unknown sandbox: %d", code)
	}
	// Neither node takes it: n1 refuses, n2 (the retry) too.
	n1.SetFull(true)
	n2.SetFull(true)
	if code := call(http.MethodPost, "/sandboxes", `{"templateID":"base"}`); code != http.StatusServiceUnavailable {
		t.Fatalf("a create both nodes refuse: %d, want 503", code)
	}

	m := scrape(t, srv.URL)
	for _, want := range []struct {
		name   string
		labels map[string]string
		value  float64
	}{
		{"aenv_node_info", map[string]string{"node": "n1", "state": "ready", "runtime": "fake"}, 1},
		{"aenv_node_cpus", map[string]string{"node": "n1"}, 2},
		{"aenv_node_memory_bytes", map[string]string{"node": "n2"}, 4096 << 20},
		{"aenv_node_pool_sandboxes", map[string]string{"node": "n2", "template": nodetest.FakeTemplate}, 1},
		{"aenv_node_image_cache_bytes", map[string]string{"node": "n1"}, 3 << 20},
		{"aenv_node_image_cache_max_bytes", map[string]string{"node": "n1"}, 10 << 20},
		{"aenv_node_image_cache_hits_total", map[string]string{"node": "n1"}, 90},
		{"aenv_node_image_cache_misses_total", map[string]string{"node": "n1"}, 10},
		{"aenv_node_images_mounted", map[string]string{"node": "n1"}, 1},
		{"aenv_sandbox_memory_used_bytes", map[string]string{"sandbox_id": running.ID, "node": running.NodeID, "template": nodetest.FakeTemplate}, nodetest.FakeMemUsed},
		{"aenv_sandbox_cpu_usage_ratio", map[string]string{"sandbox_id": running.ID}, 0.5},
		{"aenv_sandbox_create_duration_seconds", map[string]string{"outcome": "ok"}, 1},
		{"aenv_sandbox_create_duration_seconds", map[string]string{"outcome": "no_capacity"}, float64(early + 1)},
		{"aenv_sandbox_create_duration_seconds", map[string]string{"outcome": "quota"}, 0},
		{"aenv_placement_refusals_total", map[string]string{"cause": cluster.RefusedByNode}, 2},
		{"aenv_placement_refusals_total", map[string]string{"cause": "too_large"}, 0},
		{"aenv_api_requests_total", map[string]string{"route": "GET /sandboxes/{id}", "code": "404"}, 1},
		{"aenv_api_requests_total", map[string]string{"route": "POST /sandboxes", "code": "503"}, float64(early + 1)},
	} {
		if got, ok := m.value(want.name, want.labels); !ok || got != want.value {
			t.Errorf("%s%v = %v (%v), want %v", want.name, want.labels, got, ok, want.value)
		}
	}
	if _, ok := m.value("aenv_node_image_cache_bytes", map[string]string{"node": "n2"}); ok {
		t.Error("n2 reports no image cache, /metrics has one for it")
	}

	if code := call(http.MethodDelete, "/sandboxes/"+running.ID, ""); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	m = scrape(t, srv.URL)
	if _, ok := m.value("aenv_sandbox_memory_used_bytes", map[string]string{"sandbox_id": running.ID}); ok {
		t.Errorf("the killed sandbox %s is still on /metrics", running.ID)
	}
	if got, _ := m.value("aenv_node_sandboxes", map[string]string{"node": running.NodeID}); got != 0 {
		t.Errorf("aenv_node_sandboxes of %s = %v once its sandbox is killed, want 0", running.NodeID, got)
	}
}

// metrics are the families of a scrape.
type metrics map[string]*dto.MetricFamily

// value is the value of the one sample of family name whose labels
// include want: a gauge's or counter's value, a histogram's count.
func (m metrics) value(name string, want map[string]string) (float64, bool) {
	f := m[name]
	if f == nil {
		return 0, false
	}
next:
	for _, s := range f.Metric {
		have := map[string]string{}
		for _, l := range s.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case s.Gauge != nil:
			return s.Gauge.GetValue(), true
		case s.Counter != nil:
			return s.Counter.GetValue(), true
		case s.Histogram != nil:
			return float64(s.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func scrape(t *testing.T, url string) metrics {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	req.Header.Set("X-API-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s: %s", resp.Status, b)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parsing /metrics: %v", err)
	}
	return fams
}
