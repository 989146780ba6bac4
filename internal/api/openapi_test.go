package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/aenvhq/aenv/internal/api"
	"github.com/aenvhq/aenv/internal/server"
	"github.com/aenvhq/aenv/internal/template"
)

// specPath is E2B's OpenAPI description (testdata/README.md says where
// it comes from).
const specPath = "testdata/e2b-openapi.yml"

// aenvOnly are the routes aenv serves that E2B's spec does not describe:
// aenv's extensions, and routes the SDKs call that this spec version
// lacks. Each must be in the route table (a stale entry fails).
var aenvOnly = map[string]string{
	"POST /v2/sandboxes":            "the JS SDK 2.51's create (the spec has only GET /v2/sandboxes)",
	"POST /v2/sandboxes/{}/connect": "the JS SDK 2.51's connect",
	"POST /sandboxes/{}/migrate":    "live migration between nodes",
	"POST /sandboxes/batch":         "many sandboxes of one request in one call (RL)",
	"GET /snapshots/{}":             "one snapshot",
	"GET /metrics":                  "Prometheus figures",
	"POST /nodes/{}/drain":          "drain a node (the spec's POST /nodes/{} sets a status instead)",
	"DELETE /nodes/{}/drain":        "undrain a node",
	"GET /keys":                     "the cluster's API keys (the spec's are per team, under /api-keys)",
	"POST /keys":                    "",
	"DELETE /keys/{}":               "",
	"POST /teams":                   "teams and their quotas",
	"GET /teams/{}":                 "",
	"PATCH /teams/{}":               "",
	"GET /templates/usage":          "the templates' deduplicated image bytes",
	"POST /templates/pulls":         "a template from an OCI image",
	"POST /templates/builds":        "a template from a Dockerfile and its context",
	"PUT /templates/{}/files/{}":    "the upload a build's file link names (E2B's points to a bucket)",
}

// specOnly are the routes E2B's spec describes that aenv does not serve.
// Each must be in the spec and absent from the route table.
var specOnly = []string{
	"POST /access-tokens", "DELETE /access-tokens/{}",
	"GET /api-keys", "POST /api-keys", "PATCH /api-keys/{}", "DELETE /api-keys/{}",
	"POST /admin/teams/{}/api-keys", "DELETE /admin/teams/{}/api-keys/{}",
	"POST /admin/teams/{}/builds/cancel", "POST /admin/teams/{}/sandboxes/kill", "GET /admin/sandboxes/running-counts",
	"GET /secrets", "POST /secrets", "GET /secrets/{}", "POST /secrets/{}", "DELETE /secrets/{}",
	"GET /teams/{}/metrics", "GET /teams/{}/metrics/max",
	"POST /nodes/{}",
	"POST /templates", "POST /templates/{}", "GET /templates/{}", "POST /templates/{}/builds/{}",
	"GET /v2/templates", "POST /v2/templates", "PATCH /v2/templates/{}",
	"POST /templates/tags", "DELETE /templates/tags", "GET /templates/{}/tags",
}

// deviations are the routes whose success status differs from the spec's
// on purpose, with aenv's status.
var deviations = map[string]struct {
	status int
	why    string
}{
	"GET /health": {http.StatusOK, "load balancers, Kubernetes probes and install.sh read 200; no SDK calls it"},
}

// ownShapes are the routes at a path of the spec's whose body is aenv's
// own resource, not E2B's: their status is checked, their body is not
// (and an entry whose body now matches the spec is stale).
var ownShapes = map[string]string{
	"GET /teams":    "aenv's teams with their quotas and usage; E2B's are a user's teams with their API keys in clear",
	"GET /nodes":    "aenv's nodes with capacity and use; E2B's are its orchestrator's instances",
	"GET /nodes/{}": "as GET /nodes",
}

// TestOpenAPIRoutes: the routes aenv and E2B's spec have, and those only
// one has, are the ones the lists above say.
func TestOpenAPIRoutes(t *testing.T) {
	spec := loadSpec(t)
	routes := routeTable(t)
	for r := range routes {
		if _, ok := spec.ops[r]; !ok {
			if _, listed := aenvOnly[r]; !listed {
				t.Errorf("%s is in aenv's route table and not in E2B's spec: list it in aenvOnly, or fix its path", r)
			}
		}
	}
	for r := range aenvOnly {
		if _, ok := spec.ops[r]; ok {
			t.Errorf("aenvOnly lists %s, which the spec has", r)
		}
		if !routes[r] {
			t.Errorf("aenvOnly lists %s, which aenv does not serve", r)
		}
	}
	for _, r := range specOnly {
		if _, ok := spec.ops[r]; !ok {
			t.Errorf("specOnly lists %s, which the spec lacks", r)
		}
		if routes[r] {
			t.Errorf("specOnly lists %s, which aenv serves: drop it from the list", r)
		}
	}
	for r := range spec.ops {
		if !routes[r] && !slices.Contains(specOnly, r) {
			t.Errorf("the spec has %s, which aenv neither serves nor lists in specOnly", r)
		}
	}
}

// TestOpenAPIConformance drives every route that both E2B's OpenAPI spec
// and aenv's route table have against a real server, and checks that the
// success status is one the spec lists for the route and that the body
// matches the spec's schema for that status (required fields present,
// types, enums and formats right; extra fields are aenv's extensions and
// allowed).
func TestOpenAPIConformance(t *testing.T) {
	spec := loadSpec(t)
	routes := routeTable(t)

	common := map[string]bool{}
	for r := range routes {
		if _, ok := spec.ops[r]; ok {
			common[r] = true
		}
	}
	url, key, _ := startServerWith(t, func(c *server.Config) {
		c.SandboxCIDR, c.NetnsTag = "10.229.0.0/16", "oapi"
	})
	d := &driver{t: t, url: url, key: key, spec: spec, seen: map[string]bool{}}
	d.run()
	for r := range common {
		if !d.seen[r] {
			t.Errorf("%s is in the spec and in aenv's route table, and the test does not call it", r)
		}
	}
}

// routeTable is aenv's route table, with path parameters as {}.
func routeTable(t *testing.T) map[string]bool {
	store, err := template.NewCatalog(template.CatalogOptions{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, r := range api.New(api.Config{Templates: store}).Routes() {
		if r.Pattern == "/" {
			continue // the catch-all 404
		}
		out[normalRoute(r.Pattern)] = true
	}
	return out
}

var pathParam = regexp.MustCompile(`\{[^}]*\}`)

// normalRoute writes "METHOD /a/{x}" as "METHOD /a/{}", so that the
// spec's parameter names and aenv's need not agree.
func normalRoute(r string) string { return pathParam.ReplaceAllString(r, "{}") }

// driver calls the routes in an order that gives each what it needs.
type driver struct {
	t         *testing.T
	url, key  string
	spec      *openAPI
	seen      map[string]bool
	lastBody  []byte
	lastState int
}

// call sends a request to route (its path with real ids), checks the
// answer against the spec and decodes it into out; it returns the status.
func (d *driver) call(route, path string, body any, out any) int {
	d.t.Helper()
	method, _, _ := strings.Cut(route, " ")
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, d.url+path, rd)
	req.Header.Set("X-API-Key", d.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		d.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	d.seen[route] = true
	d.lastBody, d.lastState = b, resp.StatusCode
	if problems := d.spec.check(route, resp.StatusCode, b); len(problems) > 0 {
		d.t.Errorf("%s (%s) answered %d against E2B's spec:\n  %s\nbody: %.600s", route, path, resp.StatusCode, strings.Join(problems, "\n  "), b)
	}
	if out != nil && len(b) > 0 && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			d.t.Fatalf("%s: decoding %s: %v", route, b, err)
		}
	}
	return resp.StatusCode
}

// must is call that stops the test unless the answer is a success.
func (d *driver) must(route, path string, body, out any) int {
	d.t.Helper()
	code := d.call(route, path, body, out)
	if code < 200 || code > 299 {
		d.t.Fatalf("%s (%s): %d %s", route, path, code, d.lastBody)
	}
	return code
}

// until calls route until ok says its answer will do (a sample taken, a
// build done), and fails the test after timeout.
func (d *driver) until(route, path string, timeout time.Duration, out any, ok func() bool) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		d.must(route, path, nil, out)
		if ok() {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("%s (%s): still %s after %s", route, path, d.lastBody, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (d *driver) run() {
	t := d.t
	d.must("GET /health", "/health", nil, nil)

	var sb struct {
		SandboxID string `json:"sandboxID"`
	}
	d.must("POST /sandboxes", "/sandboxes", map[string]any{"templateID": "base", "timeout": 300, "metadata": map[string]string{"suite": "openapi"}}, &sb)
	id := sb.SandboxID
	t.Cleanup(func() { d.call("DELETE /sandboxes/{}", "/sandboxes/"+id, nil, nil) })
	d.must("GET /sandboxes/{}", "/sandboxes/"+id, nil, nil)
	var listed []map[string]any
	d.must("GET /sandboxes", "/sandboxes", nil, &listed)
	if len(listed) != 1 {
		t.Errorf("GET /sandboxes listed %d sandboxes, want 1", len(listed))
	}
	d.must("GET /v2/sandboxes", "/v2/sandboxes?state=running", nil, nil)
	d.must("POST /sandboxes/{}/timeout", "/sandboxes/"+id+"/timeout", map[string]any{"timeout": 300}, nil)
	d.must("POST /sandboxes/{}/refreshes", "/sandboxes/"+id+"/refreshes", map[string]any{"duration": 60}, nil)
	d.must("PUT /sandboxes/{}/network", "/sandboxes/"+id+"/network", map[string]any{"denyOut": []string{"10.99.0.0/16"}}, nil)

	// The node samples every few seconds: wait for one, so that the
	// schema is checked on a real point and not on an empty list.
	var points []map[string]any
	d.until("GET /sandboxes/{}/metrics", "/sandboxes/"+id+"/metrics", 30*time.Second, &points, func() bool { return len(points) > 0 })
	var many struct {
		Sandboxes map[string]any `json:"sandboxes"`
	}
	d.until("GET /sandboxes/metrics", "/sandboxes/metrics?sandbox_ids="+id, 30*time.Second, &many, func() bool { return len(many.Sandboxes) == 1 })
	var logs struct {
		Logs       []map[string]any `json:"logs"`
		LogEntries []map[string]any `json:"logEntries"`
	}
	d.until("GET /sandboxes/{}/logs", "/sandboxes/"+id+"/logs?start=0&limit=100", 30*time.Second, &logs, func() bool { return len(logs.Logs) > 0 })
	if len(logs.LogEntries) != len(logs.Logs) {
		t.Errorf("v1 logs: %d lines and %d entries", len(logs.Logs), len(logs.LogEntries))
	}
	d.until("GET /v2/sandboxes/{}/logs", "/v2/sandboxes/"+id+"/logs?limit=100", 30*time.Second, &logs, func() bool { return len(logs.Logs) > 0 })

	var snap struct {
		SnapshotID string `json:"snapshotID"`
	}
	d.must("POST /sandboxes/{}/snapshots", "/sandboxes/"+id+"/snapshots", map[string]any{"name": "oapi-snap"}, &snap)
	d.must("GET /snapshots", "/snapshots", nil, nil)

	var forks []struct {
		Sandbox *struct {
			SandboxID string `json:"sandboxID"`
		} `json:"sandbox"`
	}
	if code := d.must("POST /sandboxes/{}/fork", "/sandboxes/"+id+"/fork", map[string]any{"count": 1, "timeout": 120}, &forks); code != http.StatusCreated {
		t.Errorf("fork: %d, want 201 (the Python SDK reads no other status's body)", code)
	}
	if len(forks) != 1 || forks[0].Sandbox == nil {
		t.Fatalf("fork: %s", d.lastBody)
	}
	d.must("DELETE /sandboxes/{}", "/sandboxes/"+forks[0].Sandbox.SandboxID, nil, nil)

	d.must("POST /sandboxes/{}/pause", "/sandboxes/"+id+"/pause", nil, nil)
	if code := d.must("POST /sandboxes/{}/connect", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 300}, nil); code != http.StatusCreated {
		t.Errorf("connect to a paused sandbox: %d, want 201 (resumed)", code)
	}
	if code := d.must("POST /sandboxes/{}/connect", "/sandboxes/"+id+"/connect", map[string]any{"timeout": 300}, nil); code != http.StatusOK {
		t.Errorf("connect to a running sandbox: %d, want 200", code)
	}
	d.must("POST /sandboxes/{}/pause", "/sandboxes/"+id+"/pause", nil, nil)
	d.must("POST /sandboxes/{}/resume", "/sandboxes/"+id+"/resume", map[string]any{"timeout": 300}, nil)

	var templates []struct {
		TemplateID string   `json:"templateID"`
		Names      []string `json:"names"`
	}
	d.must("GET /templates", "/templates", nil, &templates)
	if i := slices.IndexFunc(templates, func(t struct {
		TemplateID string   `json:"templateID"`
		Names      []string `json:"names"`
	}) bool {
		return t.TemplateID == "base"
	}); i < 0 || !slices.Equal(templates[i].Names, []string{"base"}) {
		t.Errorf("GET /templates: base missing or without its name: %s", d.lastBody)
	}
	d.must("GET /templates/aliases/{}", "/templates/aliases/base", nil, nil)

	var build struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	d.must("POST /v3/templates", "/v3/templates", map[string]any{"name": "oapi-built", "cpuCount": 1, "memoryMB": 256}, &build)
	d.must("GET /templates/{}/files/{}", "/templates/"+build.TemplateID+"/files/0123abcd", nil, nil)
	d.must("POST /v2/templates/{}/builds/{}", "/v2/templates/"+build.TemplateID+"/builds/"+build.BuildID,
		map[string]any{"fromTemplate": "base", "steps": []map[string]any{{"type": "RUN", "args": []string{"echo built"}}}}, nil)
	var status struct {
		Status string `json:"status"`
	}
	d.until("GET /templates/{}/builds/{}/status", "/templates/"+build.TemplateID+"/builds/"+build.BuildID+"/status",
		2*time.Minute, &status, func() bool { return status.Status == "ready" || status.Status == "error" })
	if status.Status != "ready" {
		t.Fatalf("build: %s", d.lastBody)
	}
	d.must("GET /templates/{}/builds/{}/logs", "/templates/"+build.TemplateID+"/builds/"+build.BuildID+"/logs", nil, nil)
	d.must("PATCH /templates/{}", "/templates/"+build.TemplateID, map[string]any{"public": true}, nil)
	d.must("DELETE /templates/{}", "/templates/"+build.TemplateID, nil, nil)

	var teams []map[string]any
	d.must("GET /teams", "/teams", nil, &teams)
	var nodes []struct {
		ID string `json:"id"`
	}
	d.must("GET /nodes", "/nodes", nil, &nodes)
	if len(nodes) != 1 {
		t.Fatalf("GET /nodes: %s", d.lastBody)
	}
	d.must("GET /nodes/{}", "/nodes/"+nodes[0].ID, nil, nil)

	var vol struct {
		VolumeID string `json:"volumeID"`
	}
	d.must("POST /volumes", "/volumes", map[string]any{"name": "oapi-vol"}, &vol)
	d.must("GET /volumes", "/volumes", nil, nil)
	d.must("GET /volumes/{}", "/volumes/"+vol.VolumeID, nil, nil)
	d.must("DELETE /volumes/{}", "/volumes/"+vol.VolumeID, nil, nil)

	d.must("DELETE /sandboxes/{}", "/sandboxes/"+id, nil, nil)
}

// openAPI is the parsed spec.
type openAPI struct {
	doc map[string]any
	// ops maps "METHOD /path/{}" to the operation's object.
	ops map[string]map[string]any
}

func loadSpec(t *testing.T) *openAPI {
	t.Helper()
	raw, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		t.Fatalf("parsing %s: %v", specPath, err)
	}
	o := &openAPI{ops: map[string]map[string]any{}}
	if err := json.Unmarshal(js, &o.doc); err != nil {
		t.Fatal(err)
	}
	paths, _ := o.doc["paths"].(map[string]any)
	if len(paths) < 20 {
		t.Fatalf("%s has %d paths: not E2B's spec?", specPath, len(paths))
	}
	for p, v := range paths {
		for method, op := range v.(map[string]any) {
			if m, ok := op.(map[string]any); ok && method != "parameters" {
				o.ops[normalRoute(strings.ToUpper(method)+" "+p)] = m
			}
		}
	}
	return o
}

// deref follows $ref until it reaches an object that is not one.
func (o *openAPI) deref(v any) map[string]any {
	m, _ := v.(map[string]any)
	for m != nil {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m
		}
		var cur any = o.doc
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			cur = cur.(map[string]any)[part]
		}
		m, _ = cur.(map[string]any)
	}
	return m
}

// check says what is wrong with a success answer of route; error answers
// are left alone (the caller fails on an unexpected one).
func (o *openAPI) check(route string, status int, body []byte) []string {
	if status < 200 || status > 299 {
		return nil
	}
	responses := o.deref(o.ops[route]["responses"])
	var listed []string
	for code := range responses {
		if strings.HasPrefix(code, "2") {
			listed = append(listed, code)
		}
	}
	sort.Strings(listed)
	if dev, ok := deviations[route]; ok {
		if status != dev.status {
			return []string{fmt.Sprintf("status %d, and deviations says aenv answers %d (%s)", status, dev.status, dev.why)}
		}
		if slices.Contains(listed, fmt.Sprint(status)) {
			return []string{"deviations lists this route, whose status the spec now allows: drop the entry"}
		}
		return nil
	}
	resp := o.deref(responses[fmt.Sprint(status)])
	if resp == nil {
		return []string{fmt.Sprintf("status %d; the spec lists %v", status, listed)}
	}
	content, _ := resp["content"].(map[string]any)
	media := o.deref(content["application/json"])
	if media == nil {
		if len(bytes.TrimSpace(body)) > 0 && status == http.StatusNoContent {
			return []string{"a 204 with a body"}
		}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return []string{fmt.Sprintf("the spec gives a JSON body; decoding it: %v", err)}
	}
	problems := o.validate(media["schema"], v, "body")
	if why, ok := ownShapes[route]; ok {
		if len(problems) == 0 {
			return []string{"ownShapes lists this route (" + why + "), whose body now matches the spec: drop the entry"}
		}
		return nil
	}
	return problems
}

// validate checks v against schema (the subset of JSON Schema that E2B's
// spec uses: $ref, allOf, oneOf, nullable, type, required, properties,
// additionalProperties, items, enum, format date-time).
func (o *openAPI) validate(schema any, v any, at string) []string {
	s := o.deref(schema)
	if s == nil {
		return nil
	}
	if v == nil {
		if s["nullable"] == true {
			return nil
		}
		// A nullable allOf wraps a $ref: the null is the wrapper's.
		if _, ok := s["type"]; ok {
			return []string{at + ": null, and the spec's schema is not nullable"}
		}
	}
	var problems []string
	for _, sub := range asList(s["allOf"]) {
		if v == nil && s["nullable"] == true {
			break
		}
		problems = append(problems, o.validate(sub, v, at)...)
	}
	if alts := asList(s["oneOf"]); len(alts) > 0 {
		matched := false
		for _, sub := range alts {
			matched = matched || len(o.validate(sub, v, at)) == 0
		}
		if !matched {
			problems = append(problems, at+": matches none of the spec's oneOf")
		}
	}
	if enum := asList(s["enum"]); len(enum) > 0 && !slices.ContainsFunc(enum, func(e any) bool { return fmt.Sprint(e) == fmt.Sprint(v) }) {
		problems = append(problems, fmt.Sprintf("%s: %v is not one of %v", at, v, enum))
	}
	typ, _ := s["type"].(string)
	if typ == "" {
		if _, ok := s["properties"]; ok {
			typ = "object"
		}
	}
	switch typ {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return append(problems, fmt.Sprintf("%s: %T, want an object", at, v))
		}
		for _, r := range asList(s["required"]) {
			if _, ok := m[r.(string)]; !ok {
				problems = append(problems, fmt.Sprintf("%s: required field %q missing", at, r))
			}
		}
		props, _ := s["properties"].(map[string]any)
		for k, fv := range m {
			if ps, ok := props[k]; ok {
				problems = append(problems, o.validate(ps, fv, at+"."+k)...)
			} else if ap, ok := s["additionalProperties"].(map[string]any); ok {
				problems = append(problems, o.validate(ap, fv, at+"."+k)...)
			}
		}
	case "array":
		l, ok := v.([]any)
		if !ok {
			return append(problems, fmt.Sprintf("%s: %T, want an array", at, v))
		}
		for i, e := range l {
			problems = append(problems, o.validate(s["items"], e, fmt.Sprintf("%s[%d]", at, i))...)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			return append(problems, fmt.Sprintf("%s: %T, want a string", at, v))
		}
		if s["format"] == "date-time" {
			if _, err := time.Parse(time.RFC3339Nano, str); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %q is not a date-time", at, str))
			}
		}
	case "integer":
		n, ok := v.(json.Number)
		if _, err := n.Int64(); !ok || err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v, want an integer", at, v))
		}
	case "number":
		if _, ok := v.(json.Number); !ok {
			problems = append(problems, fmt.Sprintf("%s: %T, want a number", at, v))
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			problems = append(problems, fmt.Sprintf("%s: %T, want a boolean", at, v))
		}
	}
	return problems
}

func asList(v any) []any { l, _ := v.([]any); return l }

// TestOpenAPICheck: the checker finds what it is there to find (a status
// the spec does not list, a required field missing, a wrong type, a bad
// date) and passes a body that matches.
func TestOpenAPICheck(t *testing.T) {
	spec := loadSpec(t)
	bad := []struct{ route, body string }{
		{"POST /sandboxes/{}/fork", `[]`},          // at 200 below
		{"GET /sandboxes/{}/logs", `{"logs": []}`}, // no logEntries
		{"GET /sandboxes/{}/logs", `{"logs": [{"timestamp": "yesterday", "line": "x"}], "logEntries": []}`},
		{"GET /sandboxes/{}/metrics", `[{"timestamp": "2026-01-01T00:00:00Z", "cpuCount": "2"}]`},
		{"GET /templates", `[{"templateID": "base", "aliases": []}]`},
	}
	for i, b := range bad {
		status := http.StatusOK
		if problems := spec.check(b.route, status, []byte(b.body)); len(problems) == 0 {
			t.Errorf("case %d: %s %s passed the check", i, b.route, b.body)
		}
	}
	good := `{"logs": [{"timestamp": "2026-01-01T00:00:00Z", "line": "{}"}],
		"logEntries": [{"timestamp": "2026-01-01T00:00:00.5Z", "level": "info", "message": "m", "fields": {"k": "v"}}]}`
	if problems := spec.check("GET /sandboxes/{}/logs", http.StatusOK, []byte(good)); len(problems) > 0 {
		t.Errorf("a matching body failed: %v", problems)
	}
	if problems := spec.check("POST /sandboxes/{}/fork", http.StatusCreated, []byte(`[{"error": {"code": 503, "message": "full"}}]`)); len(problems) > 0 {
		t.Errorf("a matching fork answer failed: %v", problems)
	}
}
