package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/client"
)

// rawCall sends one request with key and returns the status and body.
func rawCall(t *testing.T, base, key, method, path string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// teamKey makes a key of team.
func teamKey(t *testing.T, admin *client.Client, name, team string) string {
	t.Helper()
	k, err := admin.CreateKey(context.Background(), name, client.KeyOptions{Team: team})
	if err != nil || k.Team != team {
		t.Fatalf("creating a key of team %s: %+v %v", team, k, err)
	}
	return k.Key
}

// buildTemplate builds template name (base plus a marker file) with key
// through E2B's build routes and returns its id and build id.
func buildTemplate(t *testing.T, base, key, name, marker string) (tplID, buildID string) {
	t.Helper()
	code, b := rawCall(t, base, key, "POST", "/v3/templates", map[string]any{"name": name})
	var req struct{ TemplateID, BuildID string }
	if json.Unmarshal(b, &req); code != 202 {
		t.Fatalf("requesting build of %s: %d %s", name, code, b)
	}
	path := "/v2/templates/" + req.TemplateID + "/builds/" + req.BuildID
	step := map[string]any{"type": "RUN", "args": []string{"echo " + marker + " > /home/user/marker"}, "force": false}
	if code, b := rawCall(t, base, key, "POST", path, map[string]any{"fromTemplate": "base", "steps": []any{step}}); code != 202 {
		t.Fatalf("starting build of %s: %d %s", name, code, b)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		_, b := rawCall(t, base, key, "GET", "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status", nil)
		var st struct{ Status string }
		json.Unmarshal(b, &st)
		if st.Status == "ready" {
			return req.TemplateID, req.BuildID
		}
		if st.Status == "error" || time.Now().After(deadline) {
			t.Fatalf("build of %s: %s", name, b)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestRoutesCheckTeams enumerates every route the API registers and
// calls each with another team's key against team alpha's sandbox,
// snapshot, template, build and volume. A route that names a resource
// must answer exactly as for one that does not exist (status and body);
// a list must not show alpha's; a create must not reach alpha's; an admin
// route must refuse. A route the test does not know how to exercise fails
// it: a new route cannot skip the check.
func TestRoutesCheckTeams(t *testing.T) {
	srv, admin, base := startServerWith(t, func(cfg *Config) { cfg.WarmPoolMemory = -1 })
	ctx := context.Background()
	alphaKey := teamKey(t, admin, "a", "alpha")
	betaKey := teamKey(t, admin, "b", "beta")
	alpha := client.New(base, alphaKey)

	sb := mustCreate(t, alpha, client.CreateOptions{Timeout: 300})
	snap, err := alpha.Snapshot(ctx, sb.SandboxID, "ready")
	if err != nil {
		t.Fatal(err)
	}
	vol, err := alpha.CreateVolume(ctx, "data", client.VolumeOptions{SizeMB: 16})
	if err != nil {
		t.Fatal(err)
	}
	tplID, buildID := buildTemplate(t, base, alphaKey, "app", "alpha")

	// What each path parameter names of alpha's, and a made-up one of the
	// same shape.
	const missing = "zz0000000000000000000"
	params := map[string][2]string{
		"id":         {sb.SandboxID, missing},
		"snapshotID": {snap.SnapshotID, missing},
		"templateID": {tplID, "app.0000000000"},
		"buildID":    {buildID, "00000000000000000000000000000000"},
		"volumeID":   {vol.VolumeID, missing},
		"alias":      {tplID, "app.0000000000"},
		"hash":       {"abc", "abc"},
		"teamID":     {"alpha", "nosuchteam"},
	}
	// Routes that name no resource: what each must not show or reach.
	contains := func(b []byte, s string) bool { return bytes.Contains(b, []byte(s)) }
	lists := map[string]func(t *testing.T){
		"GET /sandboxes":    func(t *testing.T) { listHides(t, base, betaKey, "/sandboxes", sb.SandboxID, sb.EnvdAccessToken) },
		"GET /v2/sandboxes": func(t *testing.T) { listHides(t, base, betaKey, "/v2/sandboxes", sb.SandboxID, sb.EnvdAccessToken) },
		"GET /sandboxes/metrics": func(t *testing.T) {
			listHides(t, base, betaKey, "/sandboxes/metrics?sandbox_ids="+sb.SandboxID, sb.SandboxID)
		},
		"GET /snapshots": func(t *testing.T) { listHides(t, base, betaKey, "/snapshots", snap.SnapshotID) },
		"GET /volumes":   func(t *testing.T) { listHides(t, base, betaKey, "/volumes", vol.VolumeID, vol.Token) },
		"GET /templates": func(t *testing.T) { listHides(t, base, betaKey, "/templates", tplID) },
		"GET /teams":     func(t *testing.T) { listHides(t, base, betaKey, "/teams", `"alpha"`) },
		"POST /sandboxes": func(t *testing.T) {
			for _, ref := range []string{"ready", snap.SnapshotID, tplID} {
				code, b := rawCall(t, base, betaKey, "POST", "/sandboxes", map[string]any{"templateID": ref, "timeout": 30})
				if code != 404 || !contains(b, "template not found") {
					t.Errorf("create from alpha's %s: %d %s, want 404", ref, code, b)
				}
			}
		},
		"POST /sandboxes/batch": func(t *testing.T) {
			for _, atomic := range []bool{false, true} {
				code, b := rawCall(t, base, betaKey, "POST", "/sandboxes/batch", map[string]any{"templateID": tplID, "count": 2, "atomic": atomic})
				if code != 404 || !contains(b, "template not found") {
					t.Errorf("a batch (atomic %v) from alpha's template: %d %s, want 404", atomic, code, b)
				}
			}
		},
		"POST /v2/sandboxes": func(t *testing.T) {
			code, b := rawCall(t, base, betaKey, "POST", "/v2/sandboxes", map[string]any{"templateID": "app", "timeout": 30})
			if code != 404 {
				t.Errorf("create from alpha's template name: %d %s, want 404", code, b)
			}
		},
		"POST /volumes": func(t *testing.T) {
			// The same name is beta's own volume.
			code, b := rawCall(t, base, betaKey, "POST", "/volumes", map[string]any{"name": "data"})
			if code != 201 || contains(b, vol.VolumeID) {
				t.Errorf("beta's volume named data: %d %s, want 201 and a volume of its own", code, b)
			}
		},
		"POST /v3/templates": func(t *testing.T) {
			code, b := rawCall(t, base, betaKey, "POST", "/v3/templates", map[string]any{"name": "app"})
			if code != 202 || contains(b, tplID) {
				t.Errorf("beta's template named app: %d %s, want 202 and an id of its own", code, b)
			}
		},
		// Pulls and builds make the caller's own template (the name is
		// qualified by its team, as POST /v3/templates shows); a bad
		// request is refused before anything is touched.
		"POST /templates/pulls": func(t *testing.T) {
			if code, b := rawCall(t, base, betaKey, "POST", "/templates/pulls?name=app", nil); code != 400 {
				t.Errorf("pull without a ref: %d %s, want 400", code, b)
			}
		},
		"POST /templates/builds": func(t *testing.T) {
			if code, b := rawCall(t, base, betaKey, "POST", "/templates/builds?name=app", nil); code != 400 {
				t.Errorf("build without a context: %d %s, want 400", code, b)
			}
		},
	}
	publicRoutes := []string{"GET /health", "/"}

	paramRe := regexp.MustCompile(`\{([A-Za-z]+)\}`)
	routes := srv.api.Routes()
	if len(routes) < 40 {
		t.Fatalf("only %d routes listed", len(routes))
	}
	for _, rt := range routes {
		method, path, _ := strings.Cut(rt.Pattern, " ")
		if path == "" {
			path, method = method, "GET"
		}
		t.Run(rt.Pattern, func(t *testing.T) {
			switch rt.Access {
			case api.Public:
				if !slices.Contains(publicRoutes, rt.Pattern) {
					t.Fatalf("route %s needs no key and is not on the list of public routes", rt.Pattern)
				}
				return
			case api.AdminOnly:
				real := paramRe.ReplaceAllStringFunc(path, func(m string) string { return params[m[1:len(m)-1]][0] + "x" })
				if code, b := rawCall(t, base, betaKey, method, real, map[string]any{}); code != 403 {
					t.Fatalf("admin route with a team's key: %d %s, want 403", code, b)
				}
				return
			}
			names := paramRe.FindAllStringSubmatch(path, -1)
			if len(names) == 0 {
				check, ok := lists[rt.Pattern]
				if !ok {
					t.Fatalf("route %s names no resource and the test does not know what it must hide: add it to the lists", rt.Pattern)
				}
				check(t)
				return
			}
			real, fake := path, path
			for _, n := range names {
				p, ok := params[n[1]]
				if !ok {
					t.Fatalf("route %s has parameter {%s} the test has no resource for: add one", rt.Pattern, n[1])
				}
				real = strings.ReplaceAll(real, n[0], p[0])
				fake = strings.ReplaceAll(fake, n[0], p[1])
			}
			body := map[string]any{"timeout": 30, "duration": 30, "name": "x", "count": 1}
			codeFake, bodyFake := rawCall(t, base, betaKey, method, fake, body)
			code, got := rawCall(t, base, betaKey, method, real, body)
			want := bodyFake
			for _, n := range names {
				p := params[n[1]]
				want = bytes.ReplaceAll(want, []byte(p[1]), []byte(p[0]))
			}
			if code != codeFake || !bytes.Equal(got, want) {
				t.Fatalf("%s %s with another team's key: %d %s\nwant what a missing one answers: %d %s", method, real, code, got, codeFake, want)
			}
			if code != 404 {
				t.Fatalf("%s %s: %d %s, want 404", method, real, code, got)
			}
		})
	}

	// Nothing beta tried touched alpha's sandbox, and alpha still drives it.
	got, err := alpha.Get(ctx, sb.SandboxID)
	if err != nil || got.State != "running" {
		t.Fatalf("alpha's sandbox after beta's calls: %+v %v", got, err)
	}
	if out := runOut(t, alpha, sb.SandboxID, "echo still"); strings.TrimSpace(out) != "still" {
		t.Fatalf("alpha's sandbox answers %q", out)
	}
	// An admin sees every team's.
	if code, b := rawCall(t, base, srv.APIKey(), "GET", "/v2/sandboxes", nil); code != 200 || !bytes.Contains(b, []byte(sb.SandboxID)) {
		t.Fatalf("admin list: %d %s, want alpha's sandbox in it", code, b)
	}
	// alpha's own template: its files, by its name.
	child := mustCreate(t, alpha, client.CreateOptions{TemplateID: "app", Timeout: 60})
	if out := runOut(t, alpha, child.SandboxID, "cat /home/user/marker"); strings.TrimSpace(out) != "alpha" {
		t.Fatalf("alpha's template app has marker %q", out)
	}
}

// listHides checks that a list beta reads shows none of secrets.
func listHides(t *testing.T, base, key, path string, secrets ...string) {
	t.Helper()
	code, b := rawCall(t, base, key, "GET", path, nil)
	if code != 200 {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	for _, s := range secrets {
		if s != "" && bytes.Contains(b, []byte(s)) {
			t.Fatalf("GET %s with another team's key shows %q: %s", path, s, b)
		}
	}
}
