package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
)

// buildStatus is E2B's TemplateBuildInfo, as much as the test reads.
type buildStatus struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Message string `json:"message"`
	} `json:"logEntries"`
	Reason *struct {
		Message string `json:"message"`
	} `json:"reason"`
}

// TestBuildsAcrossServers: a template build is a cluster record. One
// started through a server with a local node is followed (its log
// streamed, GET .../logs?follow=true) and polled (status with offsets)
// through a pure API server on the same etcd, and finishes; a build whose
// server restarts while it runs ends in error with that reason, seen from
// either server, never a 404.
func TestBuildsAcrossServers(t *testing.T) {
	a, _ := startWithAgent(t, "bj", true)
	ctx := context.Background()
	token, err := os.ReadFile(membership.ClusterTokenPath(a.cfg.DataDir))
	if err != nil {
		t.Fatal(err)
	}
	bcfg := a.cfg
	bcfg.DataDir, bcfg.RunDir = t.TempDir(), t.TempDir()
	bcfg.NodeID, bcfg.NoLocalNode, bcfg.Listen = "", true, "127.0.0.1:0"
	bcfg.EtcdEndpoints, bcfg.EtcdClientURLs = a.cfg.EtcdClientURLs, nil
	bcfg.ClusterToken = strings.TrimSpace(string(token))
	bcfg.DataKeyFile = membership.DataKeyPath(a.cfg.DataDir)
	bcfg.APIKey = a.APIKey()
	b, err := Start(ctx, bcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	urlA, urlB := "http://"+a.Addr().String(), "http://"+b.Addr().String()

	request := func(name string) (tplID, buildID string) {
		t.Helper()
		code, out := rawRequest(t, a, "POST", urlA+"/v3/templates", fmt.Sprintf(`{"name":%q}`, name))
		if code != http.StatusAccepted {
			t.Fatalf("requesting %s: %d %v", name, code, out)
		}
		return out["templateID"].(string), out["buildID"].(string)
	}
	status := func(srv *Server, url, tplID, buildID string, offset int) buildStatus {
		t.Helper()
		code, body := doRequest(t, srv, "GET", fmt.Sprintf("%s/templates/%s/builds/%s/status?logsOffset=%d", url, tplID, buildID, offset), "")
		if code != http.StatusOK {
			t.Fatalf("status through %s: %d %s", url, code, body)
		}
		var st buildStatus
		if err := json.Unmarshal(body, &st); err != nil {
			t.Fatal(err)
		}
		return st
	}

	// A build started through a, followed through b.
	tplID, buildID := request("across")
	steps := `{"fromTemplate":"base","steps":[{"type":"RUN","args":["echo first-line; for i in 1 2 3; do echo line-$i; sleep 0.5; done; echo last-line"]}]}`
	if code, body := doRequest(t, a, "POST", urlA+"/v2/templates/"+tplID+"/builds/"+buildID, steps); code != http.StatusAccepted {
		t.Fatalf("starting: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", urlB+"/templates/"+tplID+"/builds/"+buildID+"/logs?follow=true", nil)
	req.Header.Set("X-API-Key", b.APIKey())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var followed []string
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev struct {
			Log   *string         `json:"log"`
			Done  json.RawMessage `json:"done"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("event %q: %v", sc.Text(), err)
		}
		switch {
		case ev.Log != nil:
			followed = append(followed, *ev.Log)
		case ev.Done != nil:
			done = true
		case ev.Error != nil:
			t.Fatalf("the build failed: %s (log %q)", ev.Error, followed)
		}
	}
	resp.Body.Close()
	log := strings.Join(followed, "\n")
	if !done || !strings.Contains(log, "first-line") || !strings.Contains(log, "line-3") || !strings.Contains(log, "last-line") {
		t.Fatalf("followed through b: done %v (stream error %v), log %q", done, sc.Err(), followed)
	}
	// Polled through b from an offset: the entries from there on.
	all := status(b, urlB, tplID, buildID, 0)
	if all.Status != "ready" || len(all.LogEntries) < 5 {
		t.Fatalf("status through b: %+v", all)
	}
	from := status(b, urlB, tplID, buildID, 2)
	if len(from.LogEntries) != len(all.LogEntries)-2 || from.LogEntries[0].Message != all.LogEntries[2].Message {
		t.Fatalf("status from offset 2: %d entries (of %d)", len(from.LogEntries), len(all.LogEntries))
	}

	// A build whose server restarts while it runs.
	tplID, buildID = request("restarted")
	steps = `{"fromTemplate":"base","steps":[{"type":"RUN","args":["echo started; sleep 60"]}]}`
	if code, body := doRequest(t, a, "POST", urlA+"/v2/templates/"+tplID+"/builds/"+buildID, steps); code != http.StatusAccepted {
		t.Fatalf("starting: %d %s", code, body)
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		st := status(b, urlB, tplID, buildID, 0)
		if st.Status == "building" && strings.Contains(fmt.Sprint(st.LogEntries), "started") {
			break
		}
		if time.Now().After(deadline) || st.Status == "error" || st.Status == "ready" {
			t.Fatalf("the build did not get going: %+v", st)
		}
	}
	cfg := a.cfg
	if err := a.Close(ctx); err != nil {
		t.Fatal(err)
	}
	a2, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("restarting: %v", err)
	}
	defer a2.Close(ctx)
	urlA2 := "http://" + a2.Addr().String()
	for _, s := range []struct {
		srv *Server
		url string
	}{{a2, urlA2}, {b, urlB}} {
		st := status(s.srv, s.url, tplID, buildID, 0)
		if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "stopped") {
			t.Fatalf("after the restart, through %s: %+v (reason %+v)", s.url, st, st.Reason)
		}
	}
	// b closes first: a2 holds the etcd both use.
	b.Close(ctx)
}
