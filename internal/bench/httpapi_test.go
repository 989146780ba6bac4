package bench

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// request is what the fake server saw.
type request struct {
	method, path, key string
	body              map[string]any
}

func fakeServer(t *testing.T, status int, answer string) (*HTTPAPI, *[]request) {
	t.Helper()
	var seen []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := request{method: r.Method, path: r.URL.Path, key: r.Header.Get("X-API-Key")}
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			if err := json.Unmarshal(b, &req.body); err != nil {
				t.Errorf("%s %s: body %q is not JSON", r.Method, r.URL.Path, b)
			}
		}
		seen = append(seen, req)
		w.WriteHeader(status)
		io.WriteString(w, answer)
	}))
	t.Cleanup(srv.Close)
	return NewHTTPAPI(srv.URL+"/", "k3y"), &seen
}

func TestHTTPAPIRoutes(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name       string
		status     int
		answer     string
		call       func(a *HTTPAPI) error
		method     string
		path       string
		wantBodyKV map[string]float64
	}{
		{"pause", 204, "", func(a *HTTPAPI) error { return a.Pause(ctx, "sb1") }, "POST", "/sandboxes/sb1/pause", nil},
		{"resume", 201, `{"sandboxID":"sb1"}`, func(a *HTTPAPI) error { return a.Resume(ctx, "sb1", 300) },
			"POST", "/v2/sandboxes/sb1/connect", map[string]float64{"timeout": 300}},
		{"delete snapshot", 204, "", func(a *HTTPAPI) error { return a.DeleteSnapshot(ctx, "snap1") }, "DELETE", "/templates/snap1", nil},
		{"snapshot", 201, `{"snapshotID":"snap1","sizeBytes":2048,"cpuCount":2,"memoryMB":512}`, func(a *HTTPAPI) error {
			info, err := a.Snapshot(ctx, "sb1")
			if err == nil && (info != SnapshotInfo{SnapshotID: "snap1", SizeBytes: 2048, CPUCount: 2, MemoryMB: 512}) {
				t.Errorf("snapshot info = %+v", info)
			}
			return err
		}, "POST", "/sandboxes/sb1/snapshots", map[string]float64{}},
		{"fork", 201, `[{"sandbox":{"sandboxID":"c1"}},{"sandbox":{"sandboxID":"c2"}}]`, func(a *HTTPAPI) error {
			children, err := a.Fork(ctx, "sb1", 2, 300)
			if err == nil && (len(children) != 2 || children[1].SandboxID != "c2") {
				t.Errorf("children = %+v", children)
			}
			return err
		}, "POST", "/sandboxes/sb1/fork", map[string]float64{"count": 2, "timeout": 300}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, seen := fakeServer(t, tt.status, tt.answer)
			if err := tt.call(a); err != nil {
				t.Fatal(err)
			}
			if len(*seen) != 1 {
				t.Fatalf("%d requests, want 1", len(*seen))
			}
			r := (*seen)[0]
			if r.method != tt.method || r.path != tt.path || r.key != "k3y" {
				t.Errorf("request = %s %s key %q, want %s %s key k3y", r.method, r.path, r.key, tt.method, tt.path)
			}
			if tt.wantBodyKV == nil && r.body != nil {
				t.Errorf("body = %v, want none", r.body)
			}
			for k, v := range tt.wantBodyKV {
				if r.body[k] != v {
					t.Errorf("body[%s] = %v, want %v", k, r.body[k], v)
				}
			}
		})
	}
}

func TestHTTPAPIResumeOfRunningSandboxFails(t *testing.T) {
	// A connect to a running sandbox answers 200: nothing was resumed, and
	// timing it as a resume would be wrong.
	a, _ := fakeServer(t, 200, `{"sandboxID":"sb1"}`)
	if err := a.Resume(context.Background(), "sb1", 300); err == nil || !strings.Contains(err.Error(), "HTTP 200") {
		t.Errorf("err = %v, want a refusal of HTTP 200", err)
	}
}

func TestHTTPAPIErrorCarriesTheServersMessage(t *testing.T) {
	a, _ := fakeServer(t, 409, `{"code":409,"message":"sandbox sb1 is busy"}`)
	err := a.Pause(context.Background(), "sb1")
	if err == nil || !strings.Contains(err.Error(), "sandbox sb1 is busy") || !strings.Contains(err.Error(), "409") {
		t.Errorf("err = %v, want the server's message and status", err)
	}
}

func TestHTTPAPIForkReturnsTheChildrenThatStarted(t *testing.T) {
	a, _ := fakeServer(t, 200, `[{"sandbox":{"sandboxID":"c1"}},{"error":{"code":500,"message":"restore failed"}}]`)
	children, err := a.Fork(context.Background(), "sb1", 2, 300)
	if err == nil || !strings.Contains(err.Error(), "child 2: restore failed") {
		t.Errorf("err = %v, want child 2's failure", err)
	}
	if len(children) != 1 || children[0].SandboxID != "c1" {
		t.Errorf("children = %+v, want c1 (to kill it)", children)
	}
}
