package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/cluster"
)

// FuzzListQuery: list queries (metadata filters, states, page tokens) are
// parsed or refused with a {code, message} 400, never a panic; a page
// token that decodes round-trips.
func FuzzListQuery(f *testing.F) {
	tok := encodePageKey(&cluster.Sandbox{ID: "abc", StartedAt: time.Unix(1700000000, 5).UTC()})
	for _, q := range []string{
		"", "metadata=a%3Db%26c%3Dd", "state=running,paused", "state=dead", "limit=10&nextToken=" + tok,
		"nextToken=%%%", "metadata=%3D", "limit=-1", "limit=99999999999999999999",
	} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, query string) {
		r := httptest.NewRequest("GET", "/v2/sandboxes", nil)
		r.URL.RawQuery = query
		w := httptest.NewRecorder()
		if _, ok := parseListFilter(w, r); !ok {
			checkErrorBody(t, w)
		}
		if k, err := decodePageKey(query); err == nil {
			back, err := decodePageKey(encodePageKey(&cluster.Sandbox{ID: k.id, StartedAt: k.startedAt}))
			if err != nil || back.id != k.id || !back.startedAt.Equal(k.startedAt) {
				t.Fatalf("page key %q does not round-trip: %+v, %v", query, back, err)
			}
		}
	})
}

// FuzzDecodeBody: any request body either decodes into the create body or
// gets a {code, message} 4xx, never a panic.
func FuzzDecodeBody(f *testing.F) {
	for _, b := range []string{
		`{}`, `{"templateID":"base","timeout":30,"metadata":{"a":"b"},"envVars":{"X":"1"}}`,
		`{"timeout":"soon"}`, `{"timeout":1e400}`, `{"a":1}{"b":2}`, `[`, "\x00", `{"metadata":{"a":{"b":1}}}`,
	} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, body string) {
		r := httptest.NewRequest("POST", "/v2/sandboxes", strings.NewReader(body))
		r.Body = http.MaxBytesReader(httptest.NewRecorder(), r.Body, MaxBodyBytes)
		w := httptest.NewRecorder()
		var v createBody
		if !decodeBody(w, r, &v) {
			checkErrorBody(t, w)
		}
	})
}

func checkErrorBody(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	var e apiError
	if w.Code < 400 || w.Code > 499 || json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Code != w.Code || e.Message == "" {
		t.Fatalf("refusal is %d %q, want a 4xx {code, message}", w.Code, w.Body.String())
	}
}
