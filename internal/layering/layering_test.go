// Package layering holds no code: its test enforces how the module's
// packages may depend on each other, so that the layering written in
// docs/CONVENTIONS.md (api → cluster → node → runtime, nothing imports cli
// or api) cannot erode one convenient import at a time.
package layering

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/aenvhq/aenv/"

// forbidden maps a package to module packages it must not import (as
// prefixes). Test files are exempt: tests may wire anything together.
var forbidden = map[string][]string{
	"internal/runtime": {"internal/node", "internal/cluster", "internal/api", "internal/server", "internal/cli"},
	"internal/netns":   {"internal/runtime", "internal/node", "internal/cluster", "internal/api", "internal/server", "internal/cli"},
	"internal/node":    {"internal/cluster", "internal/api", "internal/server", "internal/cli", "internal/proxy"},
	// The cluster sees nodes only through the node API's own types.
	"internal/cluster":  {"internal/api", "internal/server", "internal/cli", "internal/proxy", "internal/node"},
	"internal/nodeapi":  {"internal/cluster", "internal/api", "internal/server", "internal/cli", "internal/proxy", "internal/node"},
	"internal/proxy":    {"internal/api", "internal/server", "internal/cli", "internal/cluster", "internal/node"},
	"internal/api":      {"internal/server", "internal/cli"},
	"internal/envd":     {"internal/"}, // runs inside the sandbox: stand-alone
	"internal/store":    {"internal/snapshot", "internal/node", "internal/cluster", "internal/api", "internal/server", "internal/cli"},
	"internal/snapshot": {"internal/node", "internal/cluster", "internal/api", "internal/server", "internal/cli"},
	"internal/template": {"internal/node", "internal/cluster", "internal/api", "internal/server", "internal/cli", "internal/image"},
	"internal/image":    {"internal/node", "internal/cluster", "internal/api", "internal/server", "internal/cli"},
	"internal/client":   {"internal/api", "internal/server", "internal/cli", "internal/cluster", "internal/node"},
	"internal/undo":     {"internal/"},
	// What a build is, as written: pure, for the API and the node alike.
	"internal/buildspec": {"internal/"},
	"internal/sealed":    {"internal/"}, // encryption only: anything may use it
	"internal/state":     {"internal/"}, // the live state knows nothing of what it stores
	"internal/testutil":  {"internal/api", "internal/server", "internal/cli"},
	"internal/server":    {"internal/cli"},
	"internal/bench":     {"internal/api", "internal/server", "internal/cli", "internal/cluster", "internal/node"},

	// The scheduler's choice is pure (it decides from what it is handed),
	// and the admission rule node and scheduler share stands alone.
	"internal/placement": {"internal/"},
	"internal/capacity":  {"internal/"},

	// The node agent and what it shares with the control plane (see also
	// deps_test.go, which follows imports all the way down).
	"internal/agent":      {"internal/cluster", "internal/api", "internal/server", "internal/cli"},
	"internal/membership": {"internal/node", "internal/cluster", "internal/api", "internal/server", "internal/cli", "internal/agent"},
}

// allowed lists exceptions to forbidden prefixes.
var allowed = map[string][]string{
	"internal/envd":  {"internal/envd/"},
	"internal/state": {"internal/state"}, // its conformance suite

	"internal/placement": {"internal/capacity"},
}

func TestLayering(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for pkg, bad := range forbidden {
			if rel != pkg && !strings.HasPrefix(rel, pkg+"/") {
				continue
			}
			for _, imp := range f.Imports {
				target, ok := strings.CutPrefix(strings.Trim(imp.Path.Value, `"`), module)
				if !ok {
					continue
				}
				for _, b := range bad {
					if within(target, b) && !isAllowed(pkg, target) {
						t.Errorf("%s imports %s, which %s must not depend on", strings.TrimPrefix(path, root+"/"), target, pkg)
					}
				}
			}
		}
		// The cluster classifies node errors with nodeapi's classes
		// (errors.Is); the transport's codes stay behind nodeapi.
		if within(rel, "internal/cluster") {
			for _, imp := range f.Imports {
				if p := strings.Trim(imp.Path.Value, `"`); strings.HasPrefix(p, "connectrpc.com/") {
					t.Errorf("%s imports %s: the cluster sees node errors as nodeapi's classes, not Connect codes", strings.TrimPrefix(path, root+"/"), p)
				}
			}
		}
		if rel != "cmd/aenv" && rel != "internal/server" {
			for _, imp := range f.Imports {
				p := strings.Trim(imp.Path.Value, `"`)
				if p == module+"internal/api" || p == module+"internal/cli" {
					t.Errorf("%s imports %s: only the wiring (cmd/aenv, internal/server) may", strings.TrimPrefix(path, root+"/"), p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func isAllowed(pkg, target string) bool {
	for _, a := range allowed[pkg] {
		if within(target, a) {
			return true
		}
	}
	return false
}

// within reports whether package path p is pkg or below it; a pkg ending
// in "/" matches everything below that directory.
func within(p, pkg string) bool {
	if strings.HasSuffix(pkg, "/") {
		return strings.HasPrefix(p, pkg)
	}
	return p == pkg || strings.HasPrefix(p, pkg+"/")
}

// TestPackageDocs checks that every package says what it is for.
func TestPackageDocs(t *testing.T) {
	root, _ := filepath.Abs("../..")
	documented := map[string]bool{}
	seen := map[string]bool{}
	fset := token.NewFileSet()
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		dir := filepath.Dir(path)
		seen[dir] = true
		f, err := parser.ParseFile(fset, path, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err == nil && f.Doc != nil && strings.TrimSpace(f.Doc.Text()) != "" {
			documented[dir] = true
		}
		return nil
	})
	for dir := range seen {
		if !documented[dir] {
			rel, _ := filepath.Rel(root, dir)
			t.Errorf("package %s has no doc comment", rel)
		}
	}
}
