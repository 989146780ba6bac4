package node

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestEnvdInitDialsAgain: /init to an envd that does not take connections
// yet is sent once it does (the sentry of a busy host can leave a dial
// unanswered past its timeout); one that never does fails when ctx ends,
// saying why.
func TestEnvdInitDialsAgain(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // refused until it listens again
	c := &envdClient{base: "http://" + addr, token: "tok", http: &http.Client{}}

	got := make(chan initRequest, 1)
	go func() {
		time.Sleep(100 * time.Millisecond)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Error(err)
			return
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var body initRequest
			if r.URL.Path != "/init" || r.Header.Get("X-Access-Token") != "tok" || json.NewDecoder(r.Body).Decode(&body) != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			got <- body
			w.WriteHeader(http.StatusNoContent)
		})}
		t.Cleanup(func() { srv.Close() })
		_ = srv.Serve(l)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.init(ctx, initRequest{DefaultUser: "user"}); err != nil {
		t.Fatalf("init once envd listens: %v", err)
	}
	if b := <-got; b.DefaultUser != "user" {
		t.Fatalf("envd got %+v", b)
	}

	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := &envdClient{base: "http://" + l2.Addr().String(), http: &http.Client{}}
	l2.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := dead.init(ctx, initRequest{}); err == nil || ctx.Err() == nil {
		t.Fatalf("init to nothing: %v before its deadline", err)
	}
}
