package api_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/template"
)

// TestBuildFilesGo: a build's uploaded files go when the build ends; the
// sweep removes uploads no build used once they are a day old (and
// unfinished ones), and keeps younger ones.
func TestBuildFilesGo(t *testing.T) {
	store, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	a := api.New(api.Config{Templates: store, APIKey: "k", Builds: api.RefusingJobs(t)})
	srv := httptest.NewServer(a)
	defer srv.Close()
	do := func(method, path string, body []byte) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
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
	// Uploads are kept per team: under .build-files/<the team's tag>/.
	body, _ := json.Marshal(map[string]any{"alias": "mine"})
	_, out := do("POST", "/v3/templates", body)
	buildID, _ := out["buildID"].(string)
	tplID, _ := out["templateID"].(string)
	for _, h := range []string{"used", "old", "fresh"} {
		if code, _ := do("PUT", "/templates/"+tplID+"/files/"+h, tarOf(t, "f.txt", h)); code != 200 {
			t.Fatalf("uploading %s: %d", h, code)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(store.Dir(), ".build-files", "*"))
	if len(dirs) != 1 {
		t.Fatalf("uploads of one team in %v, want one directory", dirs)
	}
	files := dirs[0]
	exists := func(name string) bool {
		_, err := os.Stat(filepath.Join(files, name))
		return !errors.Is(err, os.ErrNotExist)
	}

	// A build with a COPY of "used" (it fails: there is no base here)
	// takes its files with it when it ends.
	steps, _ := json.Marshal(map[string]any{"fromTemplate": "base",
		"steps": []map[string]any{{"type": "COPY", "args": []string{"f.txt", "/f.txt"}, "filesHash": "used"}}})
	if code, out := do("POST", "/v2/templates/"+tplID+"/builds/"+buildID, steps); code != 202 {
		t.Fatalf("starting the build: %d %v", code, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, st := do("GET", "/templates/"+tplID+"/builds/"+buildID+"/status", nil)
		if st["status"] == "error" || st["status"] == "ready" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the build did not end: %v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if exists("used") {
		t.Fatal("the uploaded files of an ended build are still there")
	}
	// They are renamed aside at once and removed after: wait for that,
	// or the sweep below counts them too.
	for {
		trash, _ := filepath.Glob(filepath.Join(store.Dir(), ".build-files", ".trash-*"))
		if len(trash) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ended build's files are still being removed: %v", trash)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Two days on, for the upload nobody asked for since, and for one
	// that never finished.
	past := time.Now().Add(-48 * time.Hour)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Chtimes(filepath.Join(files, "old", "complete"), past, past))
	must(os.MkdirAll(filepath.Join(files, ".upload-cut", "files"), 0o700))
	must(os.Chtimes(filepath.Join(files, ".upload-cut"), past, past))
	n, err := a.SweepBuildFiles(time.Now())
	if err != nil || n != 2 {
		t.Fatalf("sweep: %d removed, %v; want 2", n, err)
	}
	if exists("old") || exists(".upload-cut") || !exists("fresh") {
		t.Fatalf("after the sweep: old %v, unfinished %v, fresh %v", exists("old"), exists(".upload-cut"), exists("fresh"))
	}
	// Asking for an upload keeps it a day longer.
	if code, out := do("GET", "/templates/"+tplID+"/files/fresh", nil); code != 201 || out["present"] != true {
		t.Fatalf("files: %d %v", code, out)
	}
	if n, _ := a.SweepBuildFiles(time.Now().Add(23 * time.Hour)); n != 0 || !exists("fresh") {
		t.Fatal("the sweep removed an upload asked for less than a day ago")
	}
	if n, _ := a.SweepBuildFiles(time.Now().Add(25 * time.Hour)); n != 1 || exists("fresh") {
		t.Fatal("the sweep kept an upload a day past its last use")
	}
}
