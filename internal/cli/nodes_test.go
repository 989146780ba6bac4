package cli

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestNodes: the server's node is listed ready; drained, it refuses
// creates with a 503 that says so; undrained, it takes them again.
func TestNodes(t *testing.T) {
	e := startServer(t)
	var nodes []struct {
		ID, State string
		Capacity  struct{ CPUCount, MemoryMB int }
	}
	out := e.mustRun(t, "nodes", "-o", "json")
	if err := json.Unmarshal([]byte(out), &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("aenv nodes -o json: %q (%v)", out, err)
	}
	n := nodes[0]
	if n.State != "ready" || n.Capacity.CPUCount < 1 || n.Capacity.MemoryMB < 1 {
		t.Fatalf("the server's node: %+v", n)
	}
	if table := e.mustRun(t, "nodes"); !strings.Contains(table, n.ID) || !strings.Contains(table, "ready") {
		t.Fatalf("aenv nodes:\n%s", table)
	}
	if out := e.mustRun(t, "node", "drain", n.ID); !strings.Contains(out, "draining") {
		t.Fatalf("aenv node drain: %q", out)
	}
	r := e.run(t, "", "create", "base")
	if r.code == 0 || !strings.Contains(r.stderr, "draining") {
		t.Fatalf("create on a drained node: exit %d, stderr %q", r.code, r.stderr)
	}
	e.mustRun(t, "node", "drain", "--undo", n.ID)
	e.create(t, "base")
	if r := e.run(t, "", "node", "drain", "no-such-node"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("draining an unknown node: exit %d, stderr %q", r.code, r.stderr)
	}
}
