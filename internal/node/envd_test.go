package node

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// TestWaitReadyWaitsForServing: with the driver's notice pending, envd is
// polled once and then not until the notice comes (or envdServingPoll
// passes, here an hour); once it comes the next poll answers. A notice
// that comes while envd does not answer yet falls back to the tight poll,
// and a wait for a notice that never comes ends with ctx, saying so.
func TestWaitReadyWaitsForServing(t *testing.T) {
	var polls atomic.Int64
	var up atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		polls.Add(1)
		if up.Load() {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	c := &envdClient{base: srv.URL, http: srv.Client(), servingEvery: time.Hour}

	serving := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- c.waitReady(context.Background(), serving) }()
	time.Sleep(100 * time.Millisecond)
	if n := polls.Load(); n != 1 {
		t.Fatalf("envd was polled %d times before it said it serves, want 1", n)
	}
	up.Store(true)
	close(serving)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waitReady did not end after the notice")
	}
	if n := polls.Load(); n != 2 {
		t.Errorf("envd was polled %d times in all, want 2: one before its notice, one after", n)
	}

	// The notice before envd answers (a slow handler): tight polls after it.
	polls.Store(0)
	up.Store(false)
	go func() {
		time.Sleep(50 * time.Millisecond)
		up.Store(true)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.waitReady(ctx, serving); err != nil {
		t.Fatalf("waitReady after the notice: %v", err)
	}
	if n := polls.Load(); n < 2 {
		t.Errorf("envd was polled %d times, want the polls that met 503 and the one that met 204", n)
	}

	// No notice ever, and envd never answers: ctx ends it, saying so.
	never := make(chan struct{})
	c.servingEvery = 10 * time.Millisecond
	up.Store(false)
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := c.waitReady(ctx, never)
	if err == nil || !strings.Contains(err.Error(), "has not said it serves") || !strings.Contains(err.Error(), "503") {
		t.Fatalf("waitReady with no notice and no envd: %v", err)
	}
}
