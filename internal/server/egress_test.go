package server

import (
	"context"
	"encoding/json"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/client"
)

// egressRules lists the egress chain of a sandbox's router namespace.
func egressRules(t *testing.T, srv *Server, id string) string {
	t.Helper()
	sb, err := srv.cluster.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	prefix := netipPrefix(t, srv.cfg.SandboxCIDR)
	index := (ipToUint(sb.Addr.As4()) - ipToUint(prefix.Addr().As4())) / 4
	router := filepath.Join(srv.cfg.RunDir, "netns", srv.cfg.NetnsTag+itoa(int(index))+".router")
	out, err := exec.Command("nsenter", "--net="+router, "nft", "list", "chain", "inet", srv.cfg.NetnsTag, "egress").CombinedOutput()
	if err != nil {
		t.Fatalf("listing egress rules of %s: %v: %s", id, err, out)
	}
	return string(out)
}

// TestEgressSurvivesPauseAndFork: a sandbox created without internet access
// gets none back when it is resumed or forked.
func TestEgressSurvivesPauseAndFork(t *testing.T) {
	srv, c, url := startServerWith(t, func(cfg *Config) { cfg.WarmPoolMemory = -1 })
	ctx := context.Background()
	status, b := doRequest(t, srv, "POST", url+"/v2/sandboxes", `{"timeout": 120, "allow_internet_access": false}`)
	if status != 201 {
		t.Fatalf("create: %d %s", status, b)
	}
	id := sandboxIDOf(t, b)
	defer c.Kill(ctx, id)
	open, err := c.Create(ctx, client.CreateOptions{Timeout: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Kill(ctx, open.SandboxID)

	if rules := egressRules(t, srv, open.SandboxID); !strings.Contains(rules, "accept") {
		t.Fatalf("a sandbox with internet access has no accepting egress rule:\n%s", rules)
	}
	closed := func(what, id string) {
		t.Helper()
		if rules := egressRules(t, srv, id); strings.Contains(rules, "accept") {
			t.Fatalf("%s: sandbox without internet access has an accepting egress rule:\n%s", what, rules)
		}
	}
	closed("created", id)
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/pause", ""); status != 204 {
		t.Fatalf("pause: %d %v", status, body)
	}
	if status, body := rawRequest(t, srv, "POST", url+"/sandboxes/"+id+"/connect", `{"timeout":60}`); status != 201 {
		t.Fatalf("resume: %d %v", status, body)
	}
	closed("resumed", id)
	resp := postJSON(t, srv, url+"/sandboxes/"+id+"/fork", `{"count": 1, "timeout": 60}`)
	var kids []struct{ Sandbox client.Sandbox }
	if err := json.Unmarshal(resp, &kids); err != nil || len(kids) != 1 || kids[0].Sandbox.SandboxID == "" {
		t.Fatalf("fork answered %s: %v", resp, err)
	}
	child := kids[0].Sandbox.SandboxID
	defer c.Kill(ctx, child)
	closed("forked", child)
}

func sandboxIDOf(t *testing.T, b []byte) string {
	t.Helper()
	var sb client.Sandbox
	if err := json.Unmarshal(b, &sb); err != nil || sb.SandboxID == "" {
		t.Fatalf("no sandbox in %s: %v", b, err)
	}
	return sb.SandboxID
}

func netipPrefix(t *testing.T, s string) netip.Prefix {
	t.Helper()
	p, err := netip.ParsePrefix(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func ipToUint(a [4]byte) uint32 {
	return uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
}

func itoa(n int) string { return strconv.Itoa(n) }
