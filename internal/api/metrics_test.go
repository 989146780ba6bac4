package api_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/template"
)

// TestMetrics: /metrics wants the API key and serves the server process's
// figures in Prometheus' text format, which the client reads back.
func TestMetrics(t *testing.T) {
	store, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: store, APIKey: "k"}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/metrics without the key: %d, want 401", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/metrics", nil)
	req.Header.Set("X-API-Key", "k")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"# TYPE go_goroutines gauge", "process_open_fds", "process_resident_memory_bytes"} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("/metrics lacks %q:\n%s", want, b[:min(len(b), 2000)])
		}
	}
	m, err := client.New(srv.URL, "k").Metrics(t.Context())
	if err != nil || m["go_goroutines"] < 1 || m["process_open_fds"] < 1 {
		t.Fatalf("client.Metrics = %v, %v", m["go_goroutines"], err)
	}
}
