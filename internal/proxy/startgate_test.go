package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// Process starts wait for a slot in arrival order, each holding it until
// envd answers (not until its stream ends) or startHoldMax passes; other
// requests never wait, and a client that leaves while waiting takes no
// slot.
func TestStartGate(t *testing.T) {
	var arrived atomic.Int64
	answer := make(chan struct{}) // one receive lets one start answer
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != processStartPath {
			io.WriteString(w, "ok")
			return
		}
		arrived.Add(1)
		select {
		case <-answer:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "application/connect+json")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		// The process runs on after envd has answered.
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
	}))
	defer backend.Close()
	_, portStr, _ := net.SplitHostPort(backend.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)

	p := New(resolver{"sb1": netip.MustParseAddr("127.0.0.1")}, nil, nil)
	p.starts, p.envdPort = newStartGate(2, time.Hour), uint16(port)
	front := httptest.NewServer(p)
	defer front.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	send := func(ctx context.Context, method, path string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, method, front.URL+path, nil)
		req.Header.Set(HeaderSandboxID, "sb1")
		req.Header.Set(HeaderSandboxPort, portStr)
		return http.DefaultClient.Do(req)
	}
	start := func() chan *http.Response {
		got := make(chan *http.Response, 1)
		go func() {
			resp, err := send(ctx, "POST", processStartPath)
			if err != nil {
				resp = nil
			}
			got <- resp
		}()
		return got
	}
	settle := func(want int64, what string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for arrived.Load() != want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(50 * time.Millisecond) // and no more come
		if n := arrived.Load(); n != want {
			t.Fatalf("%s: %d starts reached envd, want %d", what, n, want)
		}
	}

	first := start()
	settle(1, "one start")
	start()
	start()
	settle(2, "three starts through two slots")

	// A request other than a start is not held back.
	resp, err := send(ctx, "GET", "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("a request that is not a start, with the slots taken: %v %v", resp, err)
	}
	resp.Body.Close()

	// A client that leaves while it waits takes no slot.
	leaving, leave := context.WithCancel(ctx)
	left := make(chan error, 1)
	go func() {
		_, err := send(leaving, "POST", processStartPath)
		left <- err
	}()
	time.Sleep(50 * time.Millisecond)
	leave()
	if err := <-left; err == nil {
		t.Fatal("a start whose client left answered")
	}

	// The first answers; its stream goes on, its slot goes to the next.
	answer <- struct{}{}
	if r := <-first; r == nil || r.StatusCode != 200 {
		t.Fatalf("the first start: %v", r)
	} else {
		defer r.Body.Close()
	}
	settle(3, "after the first start answered")

	// Starts that never answer give their slots up after holdMax.
	p.starts.holdMax = 300 * time.Millisecond
	start()
	settle(3, "with both slots held")
	answer <- struct{}{} // the second answers, the third keeps its slot
	settle(4, "after the second start answered")
	start()
	settle(4, "with both slots held again")
	time.Sleep(300 * time.Millisecond)
	settle(5, "after the fourth start's hold ran out")
}
