package api_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/template"
)

// TestBuildRoutesValidate checks what the template-build routes refuse
// before any build runs (no root needed).
func TestBuildRoutesValidate(t *testing.T) {
	store, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: store, APIKey: "k", Builds: api.RefusingJobs(t)}))
	defer srv.Close()
	do := func(method, path string, body any) (int, map[string]any) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(b))
		req.Header.Set("X-API-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	for _, name := range []string{"Upper", "base", "a/b"} {
		if code, out := do("POST", "/v3/templates", map[string]any{"name": name}); code != 400 || out["code"] != float64(400) {
			t.Errorf("name %q: %d %v", name, code, out)
		}
	}
	code, out := do("POST", "/v3/templates", map[string]any{"alias": "mine:v2"})
	// The template is the key's team's: its id is the name qualified by
	// the team, its alias the name.
	tplID, _ := out["templateID"].(string)
	if code != 202 || !strings.HasPrefix(tplID, "mine.") || out["buildID"] == "" || fmt.Sprint(out["aliases"]) != "[mine]" {
		t.Fatalf("request: %d %v", code, out)
	}
	buildID := out["buildID"].(string)
	start := "/v2/templates/" + tplID + "/builds/" + buildID
	for _, body := range []map[string]any{
		{},
		{"fromImage": "x", "fromTemplate": "base"},
		{"fromTemplate": "base", "steps": []map[string]any{{"type": "COPY", "args": []string{"a", "/a"}}}},
		{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{}}}},
		{"fromTemplate": "base", "steps": []map[string]any{{"type": "ENV", "args": []string{"A"}}}},
		{"fromTemplate": "base", "steps": []map[string]any{{"type": "HEALTHCHECK", "args": []string{"x"}}}},
		{"fromImage": "x", "fromImageRegistry": map[string]any{"type": "registry"}},
	} {
		if code, out := do("POST", start, body); code != 400 {
			t.Errorf("start %v: %d %v", body, code, out)
		}
	}
	if code, _ := do("POST", "/v2/templates/"+tplID+"/builds/other", map[string]any{"fromTemplate": "base"}); code != 404 {
		t.Errorf("unknown build id: %d", code)
	}
	code, out = do("GET", "/templates/"+tplID+"/builds/"+buildID+"/status?logsOffset=5", nil)
	if code != 200 || out["status"] != "waiting" || len(out["logEntries"].([]any)) != 0 {
		t.Fatalf("status: %d %v", code, out)
	}
	if code, _ := do("GET", "/templates/"+tplID+"/builds/"+buildID+"/status?logsOffset=-1", nil); code != 400 {
		t.Errorf("negative offset: %d", code)
	}
	if code, out := do("GET", "/templates/"+tplID+"/files/abc", nil); code != 201 || out["present"] != false || out["url"] == "" {
		t.Errorf("files: %d %v", code, out)
	}
	put := func(hash string, tarball []byte) int {
		req, _ := http.NewRequest("PUT", srv.URL+"/templates/"+tplID+"/files/"+hash, bytes.NewReader(tarball))
		req.Header.Set("X-API-Key", "k")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := put("evil", tarOf(t, "../escape", "x")); code != 400 {
		t.Errorf("escaping upload: %d", code)
	}
	if code := put("abc", tarOf(t, "dir/f.txt", "hello")); code != 200 {
		t.Errorf("upload: %d", code)
	}
	if code, out := do("GET", "/templates/"+tplID+"/files/abc", nil); code != 201 || out["present"] != true {
		t.Errorf("files after upload: %d %v", code, out)
	}

	off := httptest.NewServer(api.New(api.Config{Templates: store, APIKey: "k"}))
	defer off.Close()
	req, _ := http.NewRequest("POST", off.URL+"/v3/templates", bytes.NewReader([]byte(`{"name":"x"}`)))
	req.Header.Set("X-API-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented {
		t.Errorf("builds disabled: %d", resp.StatusCode)
	}
}

// tarOf is a gzipped tar of one file.
func tarOf(t *testing.T, name, body string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(body))
	tw.Close()
	zw.Close()
	return buf.Bytes()
}
