package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/agent"
	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/server"
	"github.com/aenvhq/aenv/internal/testutil"
)

// startServer runs a real server for the template-build routes.
func startServer(t *testing.T) (url, key string) {
	t.Helper()
	url, key, _ = startServerWith(t, nil)
	return url, key
}

// startServerWith runs a real server whose configuration mod changes, and
// returns its data directory too.
func startServerWith(t *testing.T, mod func(*server.Config)) (url, key, dataDir string) {
	t.Helper()
	testutil.RequireRoot(t)
	runsc := testutil.RequireBinary(t, "runsc", "AENV_RUNSC")
	base := os.Getenv("AENV_BASE_ROOTFS")
	if base == "" {
		testutil.Unavailable(t, "AENV_BASE_ROOTFS not set (make base builds it)")
	}
	binDir := os.Getenv("AENV_BIN_DIR")
	if binDir == "" {
		testutil.Unavailable(t, "AENV_BIN_DIR not set (make build puts envd there)")
	}
	dir := t.TempDir()
	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelDebug
	}
	cfg := server.Config{Config: agent.Config{
		Listen:         "127.0.0.1:0",
		DataDir:        filepath.Join(dir, "data"),
		RunDir:         filepath.Join(dir, "run"),
		RunscPath:      runsc,
		EnvdPath:       filepath.Join(binDir, "envd"),
		BaseRootFS:     base,
		SandboxCIDR:    "10.230.0.0/16",
		NetnsTag:       "bldt",
		NetnsPoolSize:  1,
		WarmPoolMemory: -1,
		OnStop:         cluster.StopKill,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
	}}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := server.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("starting server: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("closing server: %v", err)
		}
	})
	return "http://" + srv.Addr().String(), srv.APIKey(), cfg.DataDir
}

// call sends a JSON request and decodes the answer into out.
func call(t *testing.T, url, key, method, path string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url+path, rd)
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %d %s: %v", method, path, resp.StatusCode, b, err)
		}
	}
	return resp.StatusCode
}

type buildStatus struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Message string `json:"message"`
		Level   string `json:"level"`
	} `json:"logEntries"`
	Logs   []string `json:"logs"`
	Reason *struct {
		Message string `json:"message"`
		Step    string `json:"step"`
	} `json:"reason"`
}

// waitBuild polls a build's status as the SDK does, following logsOffset.
func waitBuild(t *testing.T, url, key, id, buildID string) (buildStatus, []string) {
	t.Helper()
	var logs []string
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var st buildStatus
		code := call(t, url, key, "GET", fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d", id, buildID, len(logs)), nil, &st)
		if code != http.StatusOK {
			t.Fatalf("status: %d", code)
		}
		for _, e := range st.LogEntries {
			logs = append(logs, e.Message)
		}
		if st.Status == "ready" || st.Status == "error" {
			return st, logs
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("build did not finish")
	return buildStatus{}, nil
}

func TestTemplateBuildAPI(t *testing.T) {
	url, key := startServer(t)
	ctx := context.Background()

	var req struct {
		TemplateID string   `json:"templateID"`
		BuildID    string   `json:"buildID"`
		Names      []string `json:"names"`
	}
	if code := call(t, url, key, "POST", "/v3/templates", map[string]any{"name": "apibuilt:v1", "cpuCount": 1, "memoryMB": 256}, &req); code != http.StatusAccepted {
		t.Fatalf("POST /v3/templates: %d", code)
	}
	if !strings.HasPrefix(req.TemplateID, "apibuilt.") || req.BuildID == "" || len(req.Names) != 1 {
		t.Fatalf("request answer = %+v", req)
	}
	// A COPY whose files were not uploaded is refused.
	var apiErr struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	copyBody := map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "COPY", "args": []string{"a", "/a", "", ""}, "filesHash": "0123"}}}
	if code := call(t, url, key, "POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, copyBody, &apiErr); code != http.StatusBadRequest ||
		apiErr.Code != 400 || !strings.Contains(apiErr.Message, "uploaded") {
		t.Fatalf("COPY build: %d %+v", code, apiErr)
	}
	// Upload the files of a COPY as the SDK does.
	var link struct {
		Present bool              `json:"present"`
		URL     string            `json:"url"`
		Headers map[string]string `json:"headers"`
	}
	if code := call(t, url, key, "GET", "/templates/"+req.TemplateID+"/files/cafe01", nil, &link); code != http.StatusCreated || link.Present || link.URL == "" {
		t.Fatalf("upload link: %d %+v", code, link)
	}
	up, _ := http.NewRequest("PUT", link.URL, bytes.NewReader(tarOf(t, "app/config.txt", "copied via the API\n")))
	for k, v := range link.Headers {
		up.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(up)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	body := map[string]any{
		"fromTemplate": "base",
		"steps": []map[string]any{
			{"type": "ENV", "args": []string{"GREETING", "hello"}},
			{"type": "RUN", "args": []string{"echo $GREETING from $(id -un) > /made-by-build", "root"}},
			{"type": "RUN", "args": []string{"id -un > whoami && echo built-step-output"}},
			{"type": "WORKDIR", "args": []string{"/opt/w"}},
			{"type": "COPY", "args": []string{"app/config.txt", "/opt/w/", "", "0600"}, "filesHash": "cafe01"},
		},
		"startCmd": "", "readyCmd": "",
	}
	if code := call(t, url, key, "POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, body, &apiErr); code != http.StatusAccepted {
		t.Fatalf("starting build: %d %+v", code, apiErr)
	}
	if code := call(t, url, key, "POST", "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, body, nil); code != http.StatusConflict {
		t.Fatalf("starting the build twice: %d", code)
	}
	st, logs := waitBuild(t, url, key, "apibuilt", req.BuildID)
	if st.Status != "ready" {
		t.Fatalf("build ended %s: %+v\n%s", st.Status, st.Reason, strings.Join(logs, "\n"))
	}
	if !strings.Contains(strings.Join(logs, "\n"), "built-step-output") {
		t.Fatalf("logs lack the step's output:\n%s", strings.Join(logs, "\n"))
	}
	// The build is over: its uploaded files are gone.
	if code := call(t, url, key, "GET", "/templates/apibuilt/files/cafe01", nil, &link); code != http.StatusCreated || link.Present {
		t.Fatalf("upload link after the build: %d %+v", code, link)
	}

	var list []struct {
		TemplateID string `json:"templateID"`
		CPUCount   int    `json:"cpuCount"`
	}
	call(t, url, key, "GET", "/templates", nil, &list)
	found := false
	for _, tpl := range list {
		found = found || (tpl.TemplateID == req.TemplateID && tpl.CPUCount == 1)
	}
	if !found {
		t.Fatalf("GET /templates = %+v", list)
	}
	var alias struct {
		TemplateID string `json:"templateID"`
	}
	if code := call(t, url, key, "GET", "/templates/aliases/apibuilt", nil, &alias); code != http.StatusOK || alias.TemplateID != req.TemplateID {
		t.Fatalf("alias: %d %+v", code, alias)
	}

	c := client.New(url, key)
	sb, err := c.Create(ctx, client.CreateOptions{TemplateID: "apibuilt", Timeout: 60})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.SandboxID)
	var out bytes.Buffer
	code, err := c.Run(ctx, sb.SandboxID, "cat /made-by-build /home/user/whoami /opt/w/config.txt; stat -c '%U %a' /opt/w/config.txt", client.RunOptions{Stdout: &out})
	if err != nil || code != 0 || out.String() != "hello from root\nuser\ncopied via the API\nuser 600\n" {
		t.Fatalf("in the sandbox: code %d, %v, output %q", code, err, out.String())
	}

	// A failing step: error status, the step named.
	var req2 struct {
		BuildID string `json:"buildID"`
	}
	call(t, url, key, "POST", "/v3/templates", map[string]any{"name": "apifail"}, &req2)
	fail := map[string]any{"fromTemplate": "base", "steps": []map[string]any{
		{"type": "RUN", "args": []string{"true"}},
		{"type": "RUN", "args": []string{"exit 3"}},
	}}
	if code := call(t, url, key, "POST", "/v2/templates/apifail/builds/"+req2.BuildID, fail, nil); code != http.StatusAccepted {
		t.Fatalf("starting failing build: %d", code)
	}
	st, _ = waitBuild(t, url, key, "apifail", req2.BuildID)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "2" || !strings.Contains(st.Reason.Message, "code 3") {
		t.Fatalf("failing build: %+v %+v", st, st.Reason)
	}
	if code := call(t, url, key, "GET", "/templates/aliases/apifail", nil, nil); code != http.StatusNotFound {
		t.Fatalf("a failed build left template apifail: %d", code)
	}
	if code := call(t, url, key, "GET", "/templates/nope/builds/x/status", nil, &apiErr); code != http.StatusNotFound || apiErr.Code != 404 {
		t.Fatalf("unknown build: %d %+v", code, apiErr)
	}
}
