package api_test

import (
	"bufio"
	"net"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/template"
)

// TestSlowBodiesAreCut: a client that sends its headers and then dribbles
// the body, with or without a key, loses the connection once the body
// timeout passes, instead of holding it for as long as it likes.
func TestSlowBodiesAreCut(t *testing.T) {
	store, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(api.New(api.Config{Templates: store, APIKey: "k", BodyTimeout: time.Second}))
	defer srv.Close()
	for _, key := range []string{"", "X-API-Key: k\r\n"} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		// Nothing below may block past this, whatever the server does.
		conn.SetDeadline(start.Add(10 * time.Second))
		conn.Write([]byte("POST /v2/sandboxes HTTP/1.1\r\nHost: x\r\n" + key + "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"))
		closed := make(chan time.Duration, 1)
		go func() {
			r := bufio.NewReader(conn)
			for {
				if _, err := r.ReadByte(); err != nil {
					closed <- time.Since(start)
					return
				}
			}
		}()
		var took time.Duration
	dribble:
		for {
			select {
			case took = <-closed:
				break dribble
			case <-time.After(100 * time.Millisecond):
				if _, err := conn.Write([]byte(" ")); err != nil {
					took = time.Since(start)
					break dribble
				}
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("key %q: a dribbling body held the connection for 10s", key)
			}
		}
		conn.Close()
		if took > 5*time.Second {
			t.Errorf("key %q: connection cut after %s, want about the 1s body timeout", key, took)
		}
	}
}
