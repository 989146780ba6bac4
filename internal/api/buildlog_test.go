package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/buildjob"
	"github.com/aenvhq/aenv/internal/buildspec"
)

// TestBuildLogTail checks the status route over a build's record: the
// log keeps only its tail, offsets keep counting from the build's first
// line (one already dropped gets the tail from its start; one past the
// end, nothing), limit bounds the entries, and the reason ends with the
// error.
func TestBuildLogTail(t *testing.T) {
	line := strings.Repeat("x", 1000)
	const lines = 3000 // 3 MB: three times the bound
	n := scriptedNode{err: "the build failed"}
	for i := range lines {
		n.lines = append(n.lines, fmt.Sprintf("%05d %s", i, line))
	}
	jobs := NewTestJobs(t, n)
	ctx := context.Background()
	if _, err := jobs.Request(ctx, buildjob.Record{TemplateID: "t", BuildID: "b", Team: ""}); err != nil {
		t.Fatal(err)
	}
	done := make(chan *buildjob.Record, 1)
	if err := jobs.Start(ctx, "t", "b", buildjob.Spec{Dockerfile: &buildspec.Dockerfile{From: "base"},
		Done: func(r *buildjob.Record) { done <- r }}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the build did not end")
	}
	bs := &builds{s: &Handler{cfg: Config{Builds: jobs}}}
	status := func(query string) statusBody {
		t.Helper()
		req := httptest.NewRequest("GET", "/templates/t/builds/b/status?"+query, nil)
		req.SetPathValue("templateID", "t")
		req.SetPathValue("buildID", "b")
		w := httptest.NewRecorder()
		bs.status(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("status: %d %s", w.Code, w.Body)
		}
		var out statusBody
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	all := status("logsOffset=0")
	size := 0
	for _, e := range all.LogEntries {
		size += len(e.Message)
	}
	if size > 1<<20 || len(all.LogEntries) < 500 {
		t.Fatalf("the log keeps %d bytes in %d entries", size, len(all.LogEntries))
	}
	first := lines + 1 - len(all.LogEntries) // the error is the last entry
	if !strings.HasPrefix(all.LogEntries[0].Message, fmt.Sprintf("%05d", first)) {
		t.Fatalf("entry %d holds %q", first, all.LogEntries[0].Message[:5])
	}
	end := lines + 1
	if got := status(fmt.Sprintf("logsOffset=%d", end-2)); len(got.LogEntries) != 2 || got.LogEntries[1].Message != "the build failed" || len(got.Logs) != 2 {
		t.Fatalf("offset end-2: %+v", got.LogEntries)
	}
	if got := status(fmt.Sprintf("logsOffset=%d&limit=1", end-2)); len(got.LogEntries) != 1 || !strings.HasPrefix(got.LogEntries[0].Message, fmt.Sprintf("%05d", lines-1)) {
		t.Fatalf("offset end-2, limit 1: %+v", got.LogEntries)
	}
	if got := status(fmt.Sprintf("logsOffset=%d", end+5)); len(got.LogEntries) != 0 {
		t.Fatalf("offset past the end: %d entries", len(got.LogEntries))
	}
	if all.Status != "error" || all.Reason == nil || all.Reason.LogEntries[len(all.Reason.LogEntries)-1].Message != "the build failed" {
		t.Fatalf("status %s, reason = %+v", all.Status, all.Reason)
	}
}
