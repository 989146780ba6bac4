package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/template"
)

// trustServer is an API with the server's admin key "admin" and a
// client's key without admin rights; builds run nothing (RefusingJobs).
func trustServer(t *testing.T, cfg api.Config) (url, clientKey string) {
	t.Helper()
	keys, err := apikeys.Open(context.Background(), state.NewMemory(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(keys.Close)
	clientKey, _, err = keys.Create(context.Background(), apikeys.KeyOptions{Name: "client"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Templates, cfg.Keys, cfg.APIKey, cfg.Pulls = store, keys, "admin", true
	if cfg.Builds == nil {
		cfg.Builds = api.RefusingJobs(t)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	srv := httptest.NewServer(api.New(cfg))
	t.Cleanup(srv.Close)
	return srv.URL, clientKey
}

// post sends body (JSON unless it is []byte) and returns the status and
// the answer's body.
func post(t *testing.T, url, key string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, _ := http.NewRequest("POST", url, rd)
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

// TestClientPullSources checks what a key without admin rights may not
// pull from: files on the server's host, registries on its loopback or
// private networks, and insecure registries; the admin key may.
func TestClientPullSources(t *testing.T) {
	// A registry on loopback, as the in-process test registries are.
	reg := httptest.NewServer(http.NotFoundHandler())
	defer reg.Close()
	loopback := strings.TrimPrefix(reg.URL, "http://") + "/x/y:1"
	url, client := trustServer(t, api.Config{})

	for _, q := range []string{
		"ref=" + loopback, "ref=docker://" + loopback, "ref=10.0.0.8/x:1", "ref=169.254.169.254/x:1",
		"ref=oci:/var/lib/aenv/templates/base", "ref=docker-archive:/etc/shadow",
		"ref=docker.io/library/busybox:1&insecure=true",
	} {
		code, body := post(t, url+"/templates/pulls?name=p&"+q, client, nil)
		if code != http.StatusForbidden || !strings.Contains(body, `"code":403`) {
			t.Errorf("client pull %s: %d %s", q, code, body)
		}
	}
	// The admin's pull of the loopback registry starts (and fails on its
	// 404, in the stream).
	if code, body := post(t, url+"/templates/pulls?name=p&ref="+loopback, "admin", nil); code != http.StatusOK || !strings.Contains(body, `"error"`) {
		t.Errorf("admin pull from loopback: %d %s", code, body)
	}

	// E2B builds: fromImage is a pull source too.
	for _, from := range []string{loopback, "oci:/var/lib/aenv", "localhost:5000/x:1"} {
		var req struct{ BuildID string }
		if code, body := post(t, url+"/v3/templates", client, map[string]any{"name": "b"}); code != http.StatusAccepted {
			t.Fatalf("requesting a build: %d %s", code, body)
		} else {
			json.Unmarshal([]byte(body), &req)
		}
		code, body := post(t, url+"/v2/templates/b/builds/"+req.BuildID, client, map[string]any{"fromImage": from})
		if code != http.StatusForbidden {
			t.Errorf("client build from %s: %d %s", from, code, body)
		}
	}

	// Dockerfile builds: FROM a path on the server's host.
	ctxTar := tarFiles(t, map[string]string{"Dockerfile": "FROM oci:/var/lib/aenv/x\nRUN true\n"})
	if code, body := post(t, url+"/templates/builds?name=d", client, ctxTar); code != http.StatusForbidden {
		t.Errorf("client Dockerfile build FROM oci:: %d %s", code, body)
	}
}

// TestBuildLimiter checks the hook for a per-team bound: it is asked
// before the build runs, its refusal ends the build with its reason, and
// what it grants is released once the build ends.
func TestBuildLimiter(t *testing.T) {
	var mu sync.Mutex
	var asked, released int
	refuse := true
	url, _ := trustServer(t, api.Config{Builds: api.LimitedJobs(t, func(ctx context.Context, team string) (func(), error) {
		mu.Lock()
		defer mu.Unlock()
		asked++
		if refuse {
			return nil, errors.New("team quota reached: 1 build at once")
		}
		return func() { mu.Lock(); released++; mu.Unlock() }, nil
	})})
	build := func() map[string]any {
		t.Helper()
		var req struct{ BuildID string }
		_, body := post(t, url+"/v3/templates", "admin", map[string]any{"name": "lim"})
		json.Unmarshal([]byte(body), &req)
		if code, body := post(t, url+"/v2/templates/lim/builds/"+req.BuildID, "admin", map[string]any{"fromTemplate": "base"}); code != http.StatusAccepted {
			t.Fatalf("starting: %d %s", code, body)
		}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			req, _ := http.NewRequest("GET", url+"/templates/lim/builds/"+req.BuildID+"/status", nil)
			req.Header.Set("X-API-Key", "admin")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var st map[string]any
			json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if st["status"] == "error" || st["status"] == "ready" {
				return st
			}
		}
		t.Fatal("the build did not end")
		return nil
	}
	st := build()
	if reason, _ := st["reason"].(map[string]any); reason == nil || !strings.Contains(reason["message"].(string), "team quota reached") {
		t.Fatalf("refused build: %v", st)
	}
	mu.Lock()
	refuse = false
	mu.Unlock()
	build() // fails later: this store has no base
	mu.Lock()
	defer mu.Unlock()
	if asked != 2 || released != 1 {
		t.Fatalf("limiter asked %d times, released %d", asked, released)
	}
}

// stream starts an admin request and returns its body as it comes.
func stream(t *testing.T, url string) io.ReadCloser {
	t.Helper()
	req, _ := http.NewRequest("POST", url, nil)
	req.Header.Set("X-API-Key", "admin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d", url, resp.StatusCode)
	}
	return resp.Body
}

// tarFiles is an uncompressed tar of files.
func tarFiles(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range files {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	tw.Close()
	return buf.Bytes()
}
