package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBuildLogTail checks that a build's log keeps only its tail, in
// bytes and in entries, that a line without end is cut, and that offsets
// keep counting from the build's first line.
func TestBuildLogTail(t *testing.T) {
	rec := &buildRecord{templateID: "t", buildID: "b", status: buildBuilding}
	line := strings.Repeat("x", 1000) + "\n"
	const lines = 3000 // 3 MB: three times the bound
	for i := range lines {
		fmt.Fprintf(rec, "%05d %s", i, line)
	}
	size := 0
	for _, e := range rec.logs {
		size += len(e.Message)
	}
	if size > maxLogBytes || rec.logBytes != size {
		t.Fatalf("the log keeps %d bytes (counted %d), over %d", size, rec.logBytes, maxLogBytes)
	}
	if rec.first+len(rec.logs) != lines || !strings.HasPrefix(rec.logs[len(rec.logs)-1].Message, fmt.Sprintf("%05d", lines-1)) {
		t.Fatalf("first %d, %d entries kept, last %q", rec.first, len(rec.logs), rec.logs[len(rec.logs)-1].Message[:5])
	}
	if !strings.HasPrefix(rec.logs[0].Message, fmt.Sprintf("%05d", rec.first)) {
		t.Fatalf("entry %d holds %q", rec.first, rec.logs[0].Message[:5])
	}

	// A line without end (`head -c 1G /dev/zero`) is kept in pieces, and
	// only its tail.
	chunk := strings.Repeat("y", 64<<10)
	for range 64 { // 4 MiB
		rec.Write([]byte(chunk))
	}
	if len(rec.partial) >= maxLineBytes || rec.logBytes > maxLogBytes {
		t.Fatalf("an endless line holds %d bytes pending, %d logged", len(rec.partial), rec.logBytes)
	}
	many := &buildRecord{}
	for range maxLogEntries + 500 {
		many.Write([]byte("\n"))
	}
	if len(many.logs) != maxLogEntries || many.first != 500 {
		t.Fatalf("%d empty lines kept as %d entries from %d", maxLogEntries+500, len(many.logs), many.first)
	}

	// The reason keeps the last lines, the error among them.
	rec.finish(errors.New("the build failed"))
	if rec.reason == nil || rec.reason.LogEntries[len(rec.reason.LogEntries)-1].Message != "the build failed" {
		t.Fatalf("reason = %+v", rec.reason)
	}

	// Offsets count from the build's first line: one already dropped
	// gets the tail from its start; one past the end, nothing.
	bs := &builds{byTemplate: map[string]*buildRecord{"t": rec}}
	status := func(offset int) statusBody {
		t.Helper()
		req := httptest.NewRequest("GET", fmt.Sprintf("/templates/t/builds/b/status?logsOffset=%d", offset), nil)
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
	end := rec.first + len(rec.logs)
	if got := status(0); len(got.LogEntries) != len(rec.logs) || got.LogEntries[0].Message != rec.logs[0].Message {
		t.Fatalf("offset 0: %d entries", len(got.LogEntries))
	}
	if got := status(end - 2); len(got.LogEntries) != 2 || got.LogEntries[1].Message != "the build failed" {
		t.Fatalf("offset end-2: %+v", got.LogEntries)
	}
	if got := status(end + 5); len(got.LogEntries) != 0 {
		t.Fatalf("offset past the end: %d entries", len(got.LogEntries))
	}
}
