//go:build linux

package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	vnetns "github.com/vishvananda/netns"

	"github.com/aenvhq/aenv/internal/client"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/state"
	"github.com/aenvhq/aenv/internal/testutil"
)

// peerHost is a network namespace standing in for other hosts of the
// cluster, joined to this one by a veth in 198.18.0.0/15 (the
// benchmarking range, outside the always-blocked ones): a node at
// nodeAddr, an etcd member at etcdAddr.
type peerHost struct {
	name               string
	prefix             netip.Prefix
	nodeAddr, etcdAddr netip.Addr
}

func newPeerHost(t *testing.T) *peerHost {
	t.Helper()
	testutil.RequireRoot(t)
	n := os.Getpid()%40 + int(tagCounter.Add(1))%10
	p := &peerHost{
		name:     fmt.Sprintf("aenvpeer%d", n),
		prefix:   netip.MustParsePrefix(fmt.Sprintf("198.18.%d.0/29", 200+n)),
		nodeAddr: netip.AddrFrom4([4]byte{198, 18, byte(200 + n), 2}),
		etcdAddr: netip.AddrFrom4([4]byte{198, 18, byte(200 + n), 3}),
	}
	hostIf := fmt.Sprintf("aenvpeerh%d", n)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	exec.Command("ip", "netns", "del", p.name).Run() // a crashed run's
	exec.Command("ip", "link", "del", hostIf).Run()
	ip("netns", "add", p.name)
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", hostIf).Run()
		exec.Command("ip", "netns", "del", p.name).Run()
	})
	ip("link", "add", hostIf, "type", "veth", "peer", "name", "eth0", "netns", p.name)
	ip("addr", "add", netip.PrefixFrom(p.prefix.Addr().Next(), 29).String(), "dev", hostIf)
	ip("link", "set", hostIf, "up")
	for _, a := range []netip.Addr{p.nodeAddr, p.etcdAddr} {
		ip("-n", p.name, "addr", "add", netip.PrefixFrom(a, 29).String(), "dev", "eth0")
	}
	ip("-n", p.name, "link", "set", "eth0", "up")
	ip("-n", p.name, "link", "set", "lo", "up")
	ip("-n", p.name, "route", "add", "default", "via", p.prefix.Addr().Next().String())
	return p
}

// listen serves addr inside the peer host: every connection is greeted
// with "member" and closed.
func (p *peerHost) listen(t *testing.T, addr string) {
	t.Helper()
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		ns, err := vnetns.GetFromName(p.name)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer ns.Close()
		if err := vnetns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		l, lerr := net.Listen("tcp4", addr)
		if err := vnetns.Set(orig); err != nil {
			ch <- result{err: err} // the thread stays locked and dies with this goroutine
			return
		}
		runtime.UnlockOSThread()
		ch <- result{l, lerr}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listening on %s in %s: %v", addr, p.name, r.err)
	}
	t.Cleanup(func() { r.l.Close() })
	go func() {
		for {
			c, err := r.l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "member")
			c.Close()
		}
	}()
}

// startEtcd runs an etcd member inside the peer host, listening on
// etcdAddr, and returns its client URL.
func (p *peerHost) startEtcd(t *testing.T) string {
	t.Helper()
	binDir := os.Getenv("AENV_BIN_DIR")
	if binDir == "" {
		testutil.Unavailable(t, "AENV_BIN_DIR must be set (make build)")
	}
	dir := t.TempDir()
	clientURL := "http://" + netip.AddrPortFrom(p.etcdAddr, 2379).String()
	cmd := exec.Command("ip", "netns", "exec", p.name, filepath.Join(binDir, "aenv"), "etcd", "--name", "peer",
		"--data-dir", filepath.Join(dir, "etcd"), "--listen-client", clientURL,
		"--listen-peer", "http://"+netip.AddrPortFrom(p.etcdAddr, 2380).String(), "--new", "--log-level", "warn",
		// A target for the sandbox to be refused, not the cluster's state:
		// plain http on the peer's address is what it takes.
		"--insecure-cluster")
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	done, err := testutil.StartTied(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
	})
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(clientURL + "/health"); err == nil {
			resp.Body.Close()
			return clientURL
		}
	}
	t.Fatalf("the peer's etcd did not come up:\n%s", tail(filepath.Join(dir, "etcd.log")))
	return ""
}

// probe connects from sandbox id to addr: "open" (greeted), "refused"
// (at once), or what happened instead.
func probe(t *testing.T, c *client.Client, id, addr string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	out := runOut(t, c, id, fmt.Sprintf(`timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%s && head -c 6 <&3' 2>&1; echo " rc=$?"`, host, port))
	switch {
	case strings.HasPrefix(out, "member rc=0"):
		return "open"
	case strings.Contains(out, "refused") && !strings.Contains(out, "rc=124"):
		return "refused"
	}
	return out
}

// waitProbe probes until it gets want (the nodes follow the registry as
// it changes, within moments).
func waitProbe(t *testing.T, c *client.Client, id, addr, want, what string) {
	t.Helper()
	var got string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if got = probe(t, c, id, addr); got == want {
			return
		}
	}
	t.Fatalf("%s: a sandbox connecting to %s: %q, want %s", what, addr, got, want)
}

// TestSandboxesNeverReachTheCluster: a sandbox with internet access, on a
// host whose operator opened the peer network (--egress-allow), reaches
// an address there until a node registers at it, is refused from then
// on (it registered after the sandbox started), and reaches it again once
// the node is removed; etcd's members are refused all along.
func TestSandboxesNeverReachTheCluster(t *testing.T) {
	peer := newPeerHost(t)
	etcdURL := peer.startEtcd(t)
	nodeAddr := netip.AddrPortFrom(peer.nodeAddr, 8100).String()
	peer.listen(t, nodeAddr)
	srv, c, _ := startServerWith(t, func(cfg *Config) {
		cfg.EtcdEndpoints = []string{etcdURL}
		cfg.InsecureCluster = true // the peer's etcd is plain http
		cfg.EgressAllow = []netip.Prefix{peer.prefix}
		cfg.WarmPoolMemory = -1
	})
	ctx := context.Background()

	// The server tells where it is reached.
	ents, _, err := srv.state.List(ctx, membership.ServerPrefix)
	must(t, err)
	if len(ents) != 1 || !strings.Contains(string(ents[0].Value), srv.Addr().String()) {
		t.Fatalf("server records %v; want this server's, with its address %s", ents, srv.Addr())
	}

	sb, err := c.Create(ctx, client.CreateOptions{Timeout: 120})
	must(t, err)
	defer c.Kill(context.Background(), sb.SandboxID)
	if got := probe(t, c, sb.SandboxID, nodeAddr); got != "open" {
		t.Fatalf("before any node registered there, a sandbox connecting to %s: %q; want it open (--egress-allow)", nodeAddr, got)
	}
	for _, port := range []int{2379, 2380} {
		addr := netip.AddrPortFrom(peer.etcdAddr, uint16(port)).String()
		if got := probe(t, c, sb.SandboxID, addr); got != "refused" {
			t.Fatalf("a sandbox connecting to etcd at %s: %q; want refused", addr, got)
		}
	}

	ghost, err := json.Marshal(membership.NodeInfo{ID: "ghost", Address: nodeAddr, UpdatedAt: time.Now().UTC()})
	must(t, err)
	for _, key := range []string{membership.KnownPrefix + "ghost", membership.LivePrefix + "ghost"} {
		_, err := srv.state.Put(ctx, key, ghost, state.WriteOptions{})
		must(t, err)
	}
	waitProbe(t, c, sb.SandboxID, nodeAddr, "refused", "a node registered there")
	must(t, membership.RemoveNode(ctx, srv.state, "ghost", time.Now().Add(time.Second)))
	waitProbe(t, c, sb.SandboxID, nodeAddr, "open", "the node removed")
}
