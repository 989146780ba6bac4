package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/console"
	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/sealed"
	"github.com/aenvhq/aenv/internal/state"
)

// consoleCluster is a cluster over a fake node, its keys, and the API
// servers in front of it that tests start (consoleServer).
type consoleCluster struct {
	st       state.Store
	cluster  *cluster.Cluster
	dataKeys *sealed.Keyring
	log      *slog.Logger
}

func newConsoleCluster(t *testing.T) *consoleCluster {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	st := state.NewMemory()
	keys := openTestKeys(t, st)
	c, err := cluster.Open(context.Background(), cluster.Config{State: st, Local: nodetest.NewFake("n1"), Candidate: "console-test",
		TickInterval: 20 * time.Millisecond, TeamLimits: api.TeamLimits(keys), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(context.Background(), cluster.StopKill) })
	kr, err := sealed.NewKeyring([]sealed.Key{sealed.NewKey()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &consoleCluster{st: st, cluster: c, dataKeys: kr, log: log}
}

func openTestKeys(t *testing.T, st state.Store) *apikeys.Keys {
	t.Helper()
	keys, err := apikeys.Open(context.Background(), st, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(keys.Close)
	return keys
}

// server starts one API server of the cluster, as Start wires it: the
// API behind the console, with keys of its own following the store.
func (cc *consoleCluster) server(t *testing.T) (string, *apikeys.Keys) {
	t.Helper()
	keys := openTestKeys(t, cc.st)
	h := api.New(api.Config{Cluster: cc.cluster, Keys: keys, Domain: "localhost", Logger: cc.log})
	srv := httptest.NewServer(withConsole(h, keys, cc.dataKeys, console.Config{Logger: cc.log}))
	t.Cleanup(srv.Close)
	return srv.URL, keys
}

// browser is a signed-in browser: its cookie jar and CSRF token.
type browser struct {
	t      *testing.T
	client *http.Client
	csrf   string
}

func signInBrowser(t *testing.T, base, key string) *browser {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	b := &browser{t: t, client: &http.Client{Jar: jar}}
	code, body := b.call(base, "POST", "/console/session", map[string]string{"apiKey": key}, false)
	var s struct{ CSRFToken string }
	if json.Unmarshal(body, &s); code != http.StatusOK || s.CSRFToken == "" {
		t.Fatalf("signing in: %d %s", code, body)
	}
	b.csrf = s.CSRFToken
	return b
}

// call sends a request with the browser's cookies, and its CSRF token if
// withCSRF.
func (b *browser) call(base, method, path string, body any, withCSRF bool) (int, []byte) {
	b.t.Helper()
	var rd io.Reader
	if body != nil {
		j, _ := json.Marshal(body)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		b.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if withCSRF {
		req.Header.Set(console.CSRFHeader, b.csrf)
	}
	res, err := b.client.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	return res.StatusCode, out
}

func createOwned(t *testing.T, c *cluster.Cluster, k apikeys.Key) string {
	t.Helper()
	sb, err := c.Create(context.Background(), cluster.CreateRequest{Spec: cluster.Spec{Timeout: time.Hour}, TemplateID: nodetest.FakeTemplate,
		Owner: cluster.Owner{KeyID: k.ID, Team: k.Team, Admin: k.Admin}})
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

// TestConsoleSessionsKeepTeamRules: through the real API, a console
// session sees and acts on what its key's team owns and nothing else,
// admin routes need an admin key's session, changes need the CSRF token,
// and another API server of the cluster accepts the session.
func TestConsoleSessionsKeepTeamRules(t *testing.T) {
	ctx := context.Background()
	cc := newConsoleCluster(t)
	base, keys := cc.server(t)
	otherBase, _ := cc.server(t)

	alphaKey, alpha, err := keys.Create(ctx, apikeys.KeyOptions{Name: "alpha", Team: "alpha"})
	if err != nil {
		t.Fatal(err)
	}
	_, beta, err := keys.Create(ctx, apikeys.KeyOptions{Name: "beta", Team: "beta"})
	if err != nil {
		t.Fatal(err)
	}
	adminKey, _, err := keys.Create(ctx, apikeys.KeyOptions{Name: "ops", Admin: true})
	if err != nil {
		t.Fatal(err)
	}
	mine := createOwned(t, cc.cluster, alpha)
	theirs := createOwned(t, cc.cluster, beta)

	b := signInBrowser(t, base, alphaKey)
	code, body := b.call(base, "GET", "/v2/sandboxes", nil, false)
	if code != http.StatusOK || !strings.Contains(string(body), mine) || strings.Contains(string(body), theirs) {
		t.Fatalf("alpha's session lists %d %s; want its sandbox %s and not beta's %s", code, body, mine, theirs)
	}
	// Another team's sandbox answers as one nobody knows, read or killed.
	code, notMine := b.call(base, "GET", "/sandboxes/"+theirs, nil, false)
	_, unknown := b.call(base, "GET", "/sandboxes/zzzznotasandbox", nil, false)
	if code != http.StatusNotFound || !bytes.Equal(notMine, bytes.ReplaceAll(unknown, []byte("zzzznotasandbox"), []byte(theirs))) {
		t.Fatalf("alpha's session reading beta's sandbox: %d %s; want what an unknown id answers (%s)", code, notMine, unknown)
	}
	if code, body := b.call(base, "DELETE", "/sandboxes/"+theirs, nil, true); code != http.StatusNotFound {
		t.Fatalf("alpha's session killing beta's sandbox: %d %s, want 404", code, body)
	}
	if _, err := cc.cluster.Get(ctx, theirs); err != nil {
		t.Fatalf("beta's sandbox after alpha's session tried to kill it: %v", err)
	}
	for _, path := range []string{"/keys", "/nodes", "/metrics"} {
		if code, _ := b.call(base, "GET", path, nil, false); code != http.StatusForbidden {
			t.Errorf("alpha's session GET %s: %d, want 403 (admin only)", path, code)
		}
	}
	if code, body := b.call(base, "POST", "/keys", map[string]any{"name": "sneaky", "admin": true}, true); code != http.StatusForbidden {
		t.Errorf("alpha's session creating an admin key: %d %s, want 403", code, body)
	}

	// Changes: refused without the token, done with it.
	if code, body := b.call(base, "DELETE", "/sandboxes/"+mine, nil, false); code != http.StatusForbidden || !strings.Contains(string(body), "CSRF") {
		t.Fatalf("a kill without the CSRF token: %d %s, want 403 naming the token", code, body)
	}
	if _, err := cc.cluster.Get(ctx, mine); err != nil {
		t.Fatalf("the sandbox after a refused kill: %v", err)
	}
	if code, body := b.call(otherBase, "POST", "/sandboxes/"+mine+"/timeout", map[string]int{"timeout": 600}, true); code != http.StatusNoContent {
		t.Fatalf("the session on another API server, setting a timeout: %d %s, want 204", code, body)
	}
	if code, body := b.call(base, "DELETE", "/sandboxes/"+mine, nil, true); code != http.StatusNoContent {
		t.Fatalf("a kill with the CSRF token: %d %s, want 204", code, body)
	}

	// An admin's session sees every team's, and the admin routes.
	a := signInBrowser(t, base, adminKey)
	if code, body := a.call(base, "GET", "/v2/sandboxes", nil, false); code != http.StatusOK || !strings.Contains(string(body), theirs) {
		t.Fatalf("the admin's session lists %d %s; want beta's sandbox too", code, body)
	}
	if code, body := a.call(base, "GET", "/keys", nil, false); code != http.StatusOK || !strings.Contains(string(body), alpha.ID) {
		t.Fatalf("the admin's session GET /keys: %d %s", code, body)
	}

	// Revoked on one server, the session ends on every server.
	if err := keys.Revoke(ctx, alpha.ID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _ := b.call(otherBase, "GET", "/v2/sandboxes", nil, false)
		if code == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a revoked key's session on another server: %d, want 401", code)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestConsoleMounted: the handler Start wires serves the console, redirects a
// browser's / to it, and answers API clients' / as before.
func TestConsoleMounted(t *testing.T) {
	cc := newConsoleCluster(t)
	base, _ := cc.server(t)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest("GET", base+"/", nil)
	req.Header.Set("Accept", "text/html")
	res, err := noRedirect.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusFound || res.Header.Get("Location") != "/console/" {
		t.Fatalf("a browser's GET /: %d to %q", res.StatusCode, res.Header.Get("Location"))
	}
	res, err = http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `"code":404`) {
		t.Fatalf("an API client's GET /: %d %s, want the API's 404", res.StatusCode, b)
	}
	res, err = http.Get(base + "/console/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(b), `<script type="module" src="js/boot.js">`) {
		t.Fatalf("GET /console/: %d %.200s", res.StatusCode, b)
	}
}
