package api

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/template"
)

// TestAnswersOutliveTheBodyTimeout: an answer that streams for longer than
// the body timeout (a followed build log, a batch create), after a body
// read whole or with no body at all, is not cut when the timeout passes;
// with the deadline left in place net/http cancelled such requests at it.
func TestAnswersOutliveTheBodyTimeout(t *testing.T) {
	store, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	h := New(Config{Templates: store, APIKey: "k", BodyTimeout: 200 * time.Millisecond})
	h.api = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rc := http.NewResponseController(w)
		for i := range 8 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			w.Write([]byte{byte('0' + i)})
			rc.Flush()
		}
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, body := range []io.Reader{nil, strings.NewReader(`{"count": 3}`)} {
		method := http.MethodGet
		if body != nil {
			method = http.MethodPost
		}
		req, _ := http.NewRequest(method, srv.URL+"/stream", body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Equal(got, []byte("01234567")) {
			t.Errorf("%s: a 0.8 s answer under a 0.2 s body timeout got %q, want all of it", method, got)
		}
	}
}
