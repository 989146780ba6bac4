package console

import (
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestAssetsServed: /console serves the page and its files with their
// content types and the headers that keep them to this origin; unknown
// paths and directories are 404s, and nothing but GET is taken.
func TestAssetsServed(t *testing.T) {
	f := newFixture(t)
	if res := f.do(httptest.NewRequest(http.MethodGet, "/console", nil)); res.StatusCode != http.StatusMovedPermanently || res.Header.Get("Location") != "/console/" {
		t.Fatalf("GET /console: %d to %q, want a redirect to /console/", res.StatusCode, res.Header.Get("Location"))
	}
	for p, want := range map[string]string{
		"/console/":                           "text/html; charset=utf-8",
		"/console/js/app.js":                  "text/javascript; charset=utf-8",
		"/console/js/pages/sandbox.js":        "text/javascript; charset=utf-8",
		"/console/console.css":                "text/css; charset=utf-8",
		"/console/vendor/uplot/uPlot.esm.js":  "text/javascript; charset=utf-8",
		"/console/vendor/uplot/uPlot.min.css": "text/css; charset=utf-8",
		"/console/js/pages/terminal.js":       "text/javascript; charset=utf-8",
		// Module scripts must be served as JavaScript, .mjs included.
		"/console/vendor/xterm/xterm.mjs":               "text/javascript; charset=utf-8",
		"/console/vendor/xterm/xterm.css":               "text/css; charset=utf-8",
		"/console/vendor/xterm-addon-fit/addon-fit.mjs": "text/javascript; charset=utf-8",
	} {
		res := f.do(httptest.NewRequest(http.MethodGet, p, nil))
		if res.StatusCode != http.StatusOK || res.Header.Get("Content-Type") != want {
			t.Errorf("GET %s: %d %q, want 200 %q", p, res.StatusCode, res.Header.Get("Content-Type"), want)
			continue
		}
		csp := res.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "connect-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: Content-Security-Policy %q, want scripts and connections from this origin only, no framing", p, csp)
		}
		if res.Header.Get("X-Content-Type-Options") != "nosniff" || res.Header.Get("ETag") == "" {
			t.Errorf("GET %s: headers %v, want nosniff and an ETag", p, res.Header)
		}
		if f.next.called {
			t.Errorf("GET %s went to the API", p)
		}
		// Revalidation.
		r := httptest.NewRequest(http.MethodGet, p, nil)
		r.Header.Set("If-None-Match", res.Header.Get("ETag"))
		if res := f.do(r); res.StatusCode != http.StatusNotModified {
			t.Errorf("GET %s with its ETag: %d, want 304", p, res.StatusCode)
		}
	}
	for _, p := range []string{"/console/nope.js", "/console/js/", "/console/index.html", "/console/../session.go", "/console/vendor/"} {
		if res := f.do(httptest.NewRequest(http.MethodGet, p, nil)); res.StatusCode != http.StatusNotFound && res.StatusCode != http.StatusMovedPermanently {
			t.Errorf("GET %s: %d, want 404", p, res.StatusCode)
		}
	}
	if res := f.do(httptest.NewRequest(http.MethodPost, "/console/js/app.js", nil)); res.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST to an asset: %d, want 405", res.StatusCode)
	}
}

// loadPattern is a load of something from another origin: an import, a
// stylesheet or script, a url() in CSS, a fetch or a socket.
var loadPattern = regexp.MustCompile(`(?i)((\bimport\s*\(\s*|\bimport\s+|\bfrom\s+)['"]|\burl\(\s*['"]?|\b(src|href|action)\s*=\s*['"]?|\bfetch\(\s*['"` + "`" + `]|@import\s+(url\()?['"]?|(WebSocket|EventSource)\(\s*['"])\s*(https?:|wss?:)?//`)

// TestAssetsLoadNothingFromElsewhere: no file of the console loads
// anything from another origin (the page works offline, no CDN), our own
// files name no external URL at all, and every file a page or module
// refers to is embedded.
func TestAssetsLoadNothingFromElsewhere(t *testing.T) {
	files := Assets()
	n := 0
	err := fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(files, p)
		if err != nil {
			return err
		}
		text := string(b)
		n++
		if m := loadPattern.FindString(text); m != "" {
			t.Errorf("%s loads from elsewhere: %q", p, m)
		}
		if !strings.HasPrefix(p, "vendor/") && (strings.Contains(text, "http://") || strings.Contains(text, "https://")) {
			t.Errorf("%s names an external URL", p)
		}
		if strings.Contains(text, "localStorage") || strings.Contains(text, "sessionStorage") || strings.Contains(text, "document.cookie") {
			if !strings.HasPrefix(p, "vendor/") {
				t.Errorf("%s uses the page's storage: the key and session stay out of it", p)
			}
		}
		for _, ref := range references(p, text) {
			if _, err := fs.Stat(files, ref); err != nil {
				t.Errorf("%s refers to %s, which is not embedded", p, ref)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 {
		t.Fatalf("only %d files embedded", n)
	}
}

var (
	importRef = regexp.MustCompile(`(?m)^\s*import\s+(?:[^'"]*\sfrom\s+)?['"]([^'"]+)['"]`)
	htmlRef   = regexp.MustCompile(`(?:src|href)="([^"#:]+)"`)
)

// references are the embedded paths file p's imports, scripts and
// stylesheets name.
func references(p, text string) []string {
	var refs []string
	var matches [][]string
	switch path.Ext(p) {
	case ".js":
		if strings.HasPrefix(p, "vendor/") {
			return nil
		}
		matches = importRef.FindAllStringSubmatch(text, -1)
	case ".html":
		matches = htmlRef.FindAllStringSubmatch(text, -1)
	}
	for _, m := range matches {
		refs = append(refs, path.Join(path.Dir(p), m[1]))
	}
	return refs
}

// TestLoadPattern: the pattern finds external loads and passes comments'
// links, so that TestAssetsLoadNothingFromElsewhere can fail.
func TestLoadPattern(t *testing.T) {
	for _, s := range []string{
		`import x from "https://cdn.test/x.js"`,
		`<script src="https://cdn.test/x.js">`,
		`<link href="//cdn.test/x.css">`,
		`background: url(https://cdn.test/a.png)`,
		`fetch("https://evil.test/")`,
		`@import "https://cdn.test/x.css";`,
	} {
		if !loadPattern.MatchString(s) {
			t.Errorf("%q is not found as a load", s)
		}
	}
	for _, s := range []string{
		`// see https://github.com/leeoniya/uPlot`,
		`// adapted from https://stackoverflow.com/questions/1`,
		`import uPlot from '../../vendor/uplot/uPlot.esm.js';`,
		`<link rel="stylesheet" href="console.css">`,
	} {
		if loadPattern.MatchString(s) {
			t.Errorf("%q is taken for an external load", s)
		}
	}
}

// TestVendoredPackages: every package web/package.json names is copied
// into assets/vendor with its licence, its files there are the ones the
// pages load, and the lockfile names no registry (integrity hashes pin
// the packages; where they come from is npm's configuration).
func TestVendoredPackages(t *testing.T) {
	files := Assets()
	pkg, err := os.ReadFile("web/package.json")
	if err != nil {
		t.Fatal(err)
	}
	var manifest struct{ Dependencies map[string]string }
	if err := json.Unmarshal(pkg, &manifest); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{"uplot": "uplot", "@xterm/xterm": "xterm", "@xterm/addon-fit": "xterm-addon-fit"}
	for name := range manifest.Dependencies {
		dir, ok := dirs[name]
		if !ok {
			t.Errorf("web/package.json names %s, which this test does not know: add where `make console-assets` copies it", name)
			continue
		}
		if _, err := fs.Stat(files, "vendor/"+dir+"/LICENSE"); err != nil {
			t.Errorf("%s: no licence in vendor/%s", name, dir)
		}
	}
	lock, err := os.ReadFile("web/package-lock.json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(lock), `"resolved"`) {
		t.Error("web/package-lock.json records where packages were fetched from: install with --omit-lockfile-registry-resolved")
	}
	// What the pages refer to, against what is vendored.
	referred := map[string]bool{}
	_ = fs.WalkDir(files, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasPrefix(p, "vendor/") {
			return err
		}
		b, _ := fs.ReadFile(files, p)
		for _, ref := range references(p, string(b)) {
			referred[ref] = true
		}
		return nil
	})
	for _, p := range []string{
		"vendor/uplot/uPlot.esm.js", "vendor/uplot/uPlot.min.css",
		"vendor/xterm/xterm.mjs", "vendor/xterm/xterm.css", "vendor/xterm-addon-fit/addon-fit.mjs",
	} {
		if !referred[p] {
			t.Errorf("no page loads %s", p)
		}
	}
	_ = fs.WalkDir(files, "vendor", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && path.Base(p) != "LICENSE" && !referred[p] {
			t.Errorf("%s is vendored but no page loads it", p)
		}
		return err
	})
}

// TestPagePolicy: the console's Content-Security-Policy lets the terminal
// style itself inline and nothing else loosen: scripts from this origin
// only (no inline script, no eval), every load from this origin only (so
// inline CSS cannot carry anything away), no framing.
func TestPagePolicy(t *testing.T) {
	f := newFixture(t)
	res := f.do(httptest.NewRequest(http.MethodGet, "/console/", nil))
	policy := map[string]string{}
	for _, d := range strings.Split(res.Header.Get("Content-Security-Policy"), ";") {
		name, value, _ := strings.Cut(strings.TrimSpace(d), " ")
		if name != "" {
			policy[name] = value
		}
	}
	for name, want := range map[string]string{
		"default-src":     "'none'",
		"script-src":      "'self'",
		"style-src":       "'self' 'unsafe-inline'",
		"img-src":         "'self' data:",
		"font-src":        "'self'",
		"connect-src":     "'self'",
		"base-uri":        "'none'",
		"form-action":     "'self'",
		"frame-ancestors": "'none'",
	} {
		if got, ok := policy[name]; !ok || got != want {
			t.Errorf("%s %q, want %q (policy %q)", name, got, want, res.Header.Get("Content-Security-Policy"))
		}
	}
	for name, value := range policy {
		if strings.Contains(value, "'unsafe-inline'") && name != "style-src" {
			t.Errorf("%s allows inline content: %q", name, value)
		}
		for _, loose := range []string{"'unsafe-eval'", "'unsafe-hashes'", "'wasm-unsafe-eval'", "*", "http:", "https:", "ws:", "wss:", "blob:"} {
			if slices.Contains(strings.Fields(value), loose) {
				t.Errorf("%s allows %s: %q", name, loose, value)
			}
		}
		if strings.HasPrefix(name, "script-src") && name != "script-src" {
			t.Errorf("%s %q: scripts have one directive, script-src 'self'", name, value)
		}
	}
}
