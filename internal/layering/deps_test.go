package layering

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// nodeSide is what runs sandboxes: the node, the runtime and its driver,
// sandbox networking, block images (FUSE, loop devices, mounts) and the
// volumes' data plane. The control plane and the CLI never link it.
var nodeSide = []string{"internal/node", "internal/runtime", "internal/netns", "internal/blockimage", "internal/volume", "internal/agent"}

// controlPlane is what decides where sandboxes run and serves clients;
// the node agent never links it.
var controlPlane = []string{"internal/cluster", "internal/api", "internal/console", "internal/server", "internal/cli"}

// depRule says that root, built for goos (empty: this host's), must not
// reach any of forbidden through its imports, direct or not (non-test
// files). Through lists packages whose edges are known and owned
// elsewhere: paths through them are not searched, and each must still lie
// on such a path (else the exception is stale and must go).
type depRule struct {
	root      string
	goos      string
	forbidden []string
	through   []string
	why       string
}

var depRules = []depRule{
	{root: "internal/cluster", forbidden: nodeSide,
		why: "the cluster sees nodes only through the node API's wire (nodeapi) and membership"},
	{root: "internal/buildjob", forbidden: nodeSide,
		why: "build jobs are control-plane records; the node runs them behind the node API"},
	{root: "internal/client", forbidden: append(append([]string{}, nodeSide...), controlPlane...),
		why: "the Go client speaks HTTP to a server"},
	{root: "internal/nodeapi", forbidden: append(append([]string{}, nodeSide...), controlPlane...),
		why: "the node API is the wire only; the node's side is node/nodeserver"},
	{root: "internal/membership", forbidden: append(append([]string{}, nodeSide...), controlPlane...),
		why: "what control plane and agent share links neither"},
	{root: "internal/agent", forbidden: controlPlane,
		why: "the node agent shares only membership and the node API with the control plane"},
	{root: "internal/template", forbidden: nodeSide,
		why: "the control plane lists templates with it; block images are made node-side (template/erofs)"},
	{root: "internal/api", forbidden: nodeSide,
		why: "the API serves clients through the cluster; builds and pulls run on nodes"},
	{root: "internal/console", forbidden: append(append([]string{}, nodeSide...), "internal/api", "internal/cluster"),
		why: "the web console's pages call the REST API over HTTP; its session layer needs only the keys and the data key"},
	// The CLI's client side is what builds off Linux: on Linux the host's
	// commands (server, node, etcd, image-server) link everything.
	{root: "cmd/aenv", goos: "darwin", forbidden: append(append([]string{}, nodeSide...), "internal/cluster", "internal/api", "internal/server", "internal/template", "internal/image", "internal/build", "internal/state"),
		why: "the CLI on a laptop is a client of a server"},
}

// graph is the import graph of one build: package -> its imports, for
// the module's packages, with the module prefix cut.
type graph map[string][]string

// loadGraph lists the deps of root for goos with `go list -deps`.
func loadGraph(t *testing.T, moduleRoot, root, goos string) graph {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./"+root)
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if goos != "" {
		cmd.Env = append(cmd.Env, "GOOS="+goos)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s (GOOS=%s): %v: %s", root, goos, err, stderr.String())
	}
	g := graph{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg, ok := strings.CutPrefix(f[0], module)
		if !ok {
			continue
		}
		for _, imp := range f[1:] {
			if p, ok := strings.CutPrefix(imp, module); ok {
				g[pkg] = append(g[pkg], p)
			}
		}
	}
	return g
}

// pathTo is the shortest import path from root to a package matching
// target (as within does), not passing through skip; nil if none.
func (g graph) pathTo(root string, target func(string) bool, skip func(string) bool) []string {
	prev := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p != root && target(p) {
			var path []string
			for q := p; q != ""; q = prev[q] {
				path = append([]string{q}, path...)
			}
			return path
		}
		if p != root && skip(p) {
			continue
		}
		for _, imp := range g[p] {
			if _, seen := prev[imp]; !seen {
				prev[imp] = p
				queue = append(queue, imp)
			}
		}
	}
	return nil
}

func matchAny(prefixes []string) func(string) bool {
	return func(p string) bool {
		for _, f := range prefixes {
			if within(p, f) {
				return true
			}
		}
		return false
	}
}

// TestTransitiveDeps enforces depRules over the whole import graph, so
// that a forbidden package cannot come in by way of an allowed one.
func TestTransitiveDeps(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("the go command is needed to list dependencies: %v", err)
	}
	moduleRoot, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range depRules {
		t.Run(strings.ReplaceAll(r.root, "/", "_")+"_"+r.goos, func(t *testing.T) {
			g := loadGraph(t, moduleRoot, r.root, r.goos)
			if _, ok := g[r.root]; !ok {
				t.Fatalf("%s is not a package of the module", r.root)
			}
			for _, v := range checkRule(g, r) {
				t.Error(v)
			}
		})
	}
}

// checkRule returns what breaks r in g, one line each.
func checkRule(g graph, r depRule) []string {
	var out []string
	on := ""
	if r.goos != "" {
		on = " (GOOS=" + r.goos + ")"
	}
	for _, f := range r.forbidden {
		if path := g.pathTo(r.root, matchAny([]string{f}), matchAny(r.through)); path != nil {
			out = append(out, fmt.Sprintf("%s must not reach %s%s (%s), but does: %s", r.root, f, on, r.why, strings.Join(path, " -> ")))
		}
	}
	for _, via := range r.through {
		if g.pathTo(via, matchAny(r.forbidden), func(string) bool { return false }) == nil || g.pathTo(r.root, matchAny([]string{via}), func(string) bool { return false }) == nil {
			out = append(out, fmt.Sprintf("%s's exception for paths through %s is stale: no forbidden package is reached that way; remove it", r.root, via))
		}
	}
	return out
}

// TestCheckRule: a forbidden package reached through an allowed one is
// reported with the whole path; an exception covers only its own paths,
// and one that covers nothing is stale.
func TestCheckRule(t *testing.T) {
	g := graph{
		"internal/cli":    {"internal/client", "internal/server"},
		"internal/client": {"internal/ids"},
		"internal/server": {"internal/node"},
		"internal/node":   {"internal/runtime"},
	}
	r := depRule{root: "internal/cli", forbidden: []string{"internal/runtime"}, why: "test"}
	got := checkRule(g, r)
	if len(got) != 1 || !strings.Contains(got[0], "internal/cli -> internal/server -> internal/node -> internal/runtime") {
		t.Fatalf("violations %q, want the path cli -> server -> node -> runtime", got)
	}
	r.through = []string{"internal/server"}
	if got := checkRule(g, r); len(got) != 0 {
		t.Fatalf("with the exception: %q, want none", got)
	}
	g["internal/client"] = append(g["internal/client"], "internal/runtime")
	if got := checkRule(g, r); len(got) != 1 || !strings.Contains(got[0], "internal/cli -> internal/client -> internal/runtime") {
		t.Fatalf("a second path around the exception: %q", got)
	}
	r.through = []string{"internal/ids"}
	if got := checkRule(graph{"internal/cli": {"internal/ids"}}, r); len(got) != 1 || !strings.Contains(got[0], "stale") {
		t.Fatalf("an exception covering nothing: %q, want it reported stale", got)
	}
}
