package server

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/client"
)

// TestInitTakeover: nobody but the node configures envd. Through the proxy
// without a key, and from inside the sandbox as uid 1000 (on loopback and
// on its own address), POST /init is refused, and the sandbox's owner
// keeps using it as before.
func TestInitTakeover(t *testing.T) {
	srv, c, url := startServer(t)
	ctx := context.Background()
	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, sb.SandboxID)

	req, _ := http.NewRequest("POST", url+"/init", strings.NewReader(`{"accessToken":"x","defaultUser":"root"}`))
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("/init through the proxy without a key: %d, want 403", resp.StatusCode)
	}

	for _, addr := range []string{"127.0.0.1", "169.254.0.21"} {
		got := runOut(t, c, sb.SandboxID, `python3 -c '
import urllib.request, urllib.error
r = urllib.request.Request("http://`+addr+`:49983/init", data=b"{\"accessToken\":\"x\",\"defaultUser\":\"root\"}", method="POST")
try:
    print(urllib.request.urlopen(r).status)
except urllib.error.HTTPError as e:
    print(e.code)
'`)
		if got != "403" {
			t.Fatalf("/init from inside the sandbox via %s answered %s, want 403", addr, got)
		}
	}
	if who := runOut(t, c, sb.SandboxID, "id -u"); who != "1000" {
		t.Fatalf("after the attempts commands run as uid %s, want 1000 (and need no token)", who)
	}
	_ = srv
}
