package client

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
)

func TestListWithPagesAndFilters(t *testing.T) {
	var queries []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-API-Key") != "e2b_k" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		queries = append(queries, r.URL.Query())
		if r.URL.Query().Get("nextToken") == "" {
			w.Header().Set("X-Next-Token", "page2")
			_ = json.NewEncoder(w).Encode([]Sandbox{{SandboxID: "a"}, {SandboxID: "b"}})
			return
		}
		_ = json.NewEncoder(w).Encode([]Sandbox{{SandboxID: "c"}})
	}))
	defer srv.Close()
	list, err := New(srv.URL+"/", "e2b_k").ListWith(context.Background(), ListOptions{
		Metadata: map[string]string{"owner": "ci & co", "n": "1"},
		States:   []string{"running", "paused"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[2].SandboxID != "c" {
		t.Fatalf("got %+v, want a, b, c", list)
	}
	if len(queries) != 2 || queries[1].Get("nextToken") != "page2" {
		t.Fatalf("queries %v: the second page was not asked for with the token", queries)
	}
	md, err := url.ParseQuery(queries[0].Get("metadata"))
	if err != nil || md.Get("owner") != "ci & co" || md.Get("n") != "1" {
		t.Fatalf("metadata query %q", queries[0].Get("metadata"))
	}
	if queries[0].Get("state") != "running,paused" {
		t.Fatalf("state query %q", queries[0].Get("state"))
	}
}

func TestAPIErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sandboxes/gone":
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"code":404,"message":"sandbox not found: gone"}`)
		default:
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "upstream broke\n")
		}
	}))
	defer srv.Close()
	c := New(srv.URL, "k")
	_, err := c.Get(context.Background(), "gone")
	if !IsStatus(err, 404) || err.Error() != "getting sandbox gone: sandbox not found: gone (HTTP 404)" {
		t.Fatalf("got %v", err)
	}
	err = c.Kill(context.Background(), "other")
	if !IsStatus(err, 502) || !strings.HasSuffix(err.Error(), "upstream broke (HTTP 502)") {
		t.Fatalf("got %v", err)
	}

	srv.Close()
	_, err = c.List(context.Background())
	if err == nil || !strings.Contains(err.Error(), "cannot reach the server at "+srv.URL) {
		t.Fatalf("unreachable server: %v", err)
	}
}

func TestConnectReportsResume(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v2/sandboxes/abc/connect" {
			t.Errorf("path %s", r.URL.Path)
		}
		var body map[string]int
		_ = json.NewDecoder(r.Body).Decode(&body)
		if body["timeout"] != 60 {
			t.Errorf("timeout %d, want 60", body["timeout"])
		}
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"sandboxID":"abc","envdAccessToken":"tok"}`)
	}))
	defer srv.Close()
	c := New(srv.URL, "k")
	for _, s := range []int{http.StatusOK, http.StatusCreated} {
		status = s
		sb, resumed, err := c.Connect(context.Background(), "abc", 60e9)
		if err != nil || sb.EnvdAccessToken != "tok" || resumed != (s == http.StatusCreated) {
			t.Fatalf("status %d: %+v resumed=%v err=%v", s, sb, resumed, err)
		}
	}
}

// TestFilesRequests: uploads and downloads go to envd through the proxy,
// with the routing headers and the access token, and never the API key.
func TestFilesRequests(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header
		if h.Get("E2b-Sandbox-Id") != "sb1" || h.Get("E2b-Sandbox-Port") != "49983" || h.Get("X-Access-Token") != "tok" {
			t.Errorf("routing headers %v", h)
		}
		if h.Get("X-API-Key") != "" {
			t.Error("the API key was sent towards the sandbox")
		}
		if r.URL.Path != "/files" || r.URL.Query().Get("path") != "/tmp/a b" || r.URL.Query().Get("username") != "user" {
			t.Errorf("url %s", r.URL)
		}
		switch r.Method {
		case http.MethodPost:
			b, _ := io.ReadAll(r.Body)
			if string(b) != "hello" || r.ContentLength != 5 || h.Get("Content-Type") != "application/octet-stream" {
				t.Errorf("upload body %q length %d type %q", b, r.ContentLength, h.Get("Content-Type"))
			}
			_, _ = io.WriteString(w, `[{"path":"/tmp/a b","name":"a b","type":"file"}]`)
		case http.MethodGet:
			if h.Get("Accept-Encoding") != "identity" {
				t.Errorf("Accept-Encoding %q", h.Get("Accept-Encoding"))
			}
			if r.URL.Query().Get("fail") != "" {
				return
			}
			w.Header().Set("Content-Length", "5")
			_, _ = io.WriteString(w, "hello")
		}
	}))
	defer srv.Close()
	c := New(srv.URL, "e2b_secret")
	opts := FileOptions{User: "user", AccessToken: "tok", Size: 5}
	if err := c.Upload(context.Background(), "sb1", "/tmp/a b", strings.NewReader("hello"), opts); err != nil {
		t.Fatal(err)
	}
	rc, size, err := c.Download(context.Background(), "sb1", "/tmp/a b", opts)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" || size != 5 {
		t.Fatalf("downloaded %q size %d", b, size)
	}
}

func TestFilesErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"code":404,"message":"reading /nope: no such file or directory"}`)
	}))
	defer srv.Close()
	_, _, err := New(srv.URL, "k").Download(context.Background(), "sb1", "/nope", FileOptions{})
	if !IsStatus(err, 404) || !strings.Contains(err.Error(), "no such file or directory") {
		t.Fatalf("got %v", err)
	}
}

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		st   ExitStatus
		want int
	}{
		{ExitStatus{Code: 3, Exited: true, Status: "exit status 3"}, 3},
		{ExitStatus{Code: -1, Status: "signal: killed"}, 137},
		{ExitStatus{Code: -1, Status: "signal: terminated"}, 143},
		{ExitStatus{Code: -1, Status: "signal: segmentation fault (core dumped)"}, 139},
		{ExitStatus{Code: -1, Status: "something else"}, 255},
	} {
		if got := tc.st.ExitCode(); got != tc.want {
			t.Fatalf("%+v: got %d, want %d", tc.st, got, tc.want)
		}
	}
}
