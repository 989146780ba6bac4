package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRunCode checks the request runCode makes (route, routing headers,
// token, body) and how the event stream is read, against a fake of the
// interpreter's /execute.
func TestRunCode(t *testing.T) {
	var got struct {
		path, id, port, token string
		body                  map[string]string
	}
	answer := ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.path, got.id, got.port, got.token = r.Method+" "+r.URL.Path, r.Header.Get("E2b-Sandbox-Id"),
			r.Header.Get("E2b-Sandbox-Port"), r.Header.Get("X-Access-Token")
		_ = json.NewDecoder(r.Body).Decode(&got.body)
		if answer == "" {
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte(`{"code":502,"message":"sandbox port 49999 is not open"}`))
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		_, _ = w.Write([]byte(answer))
	}))
	defer srv.Close()
	c := New(srv.URL, "e2b_k")
	ctx := context.Background()

	answer = `{"type":"stdout","text":"hi\n"}` + "\n" +
		`{"type":"result","text":"'shown'","is_main_result":false}` + "\n" +
		`{"type":"result","text":"2","is_main_result":true}` + "\n" +
		`{"type":"end_of_execution"}` + "\n"
	ex, err := c.RunCode(ctx, "sb1", "print('hi'); 1+1", "tok")
	if err != nil {
		t.Fatal(err)
	}
	if ex.Text != "2" || ex.Stdout != "hi\n" || ex.ErrorName != "" {
		t.Fatalf("execution %+v: want text 2, stdout hi", ex)
	}
	if got.path != "POST /execute" || got.id != "sb1" || got.port != "49999" || got.token != "tok" || got.body["code"] != "print('hi'); 1+1" {
		t.Fatalf("request %+v", got)
	}

	answer = `{"type":"error","name":"ZeroDivisionError","value":"division by zero"}` + "\n" + `{"type":"end_of_execution"}` + "\n"
	if ex, err = c.RunCode(ctx, "sb1", "1/0", ""); err != nil || ex.ErrorName != "ZeroDivisionError" {
		t.Fatalf("an exception: %+v, %v; want it in the execution, not an error", ex, err)
	}
	if got.token != "" {
		t.Fatalf("token %q sent for a sandbox with none", got.token)
	}

	answer = `{"type":"stdout","text":"cut"}` + "\n"
	if _, err := c.RunCode(ctx, "sb1", "x", ""); err == nil || !strings.Contains(err.Error(), "end_of_execution") {
		t.Fatalf("a stream cut short: %v", err)
	}
	answer = ""
	if _, err := c.RunCode(ctx, "sb1", "x", ""); !IsStatus(err, http.StatusBadGateway) || !strings.Contains(err.Error(), "49999") {
		t.Fatalf("an error answer: %v", err)
	}
}
