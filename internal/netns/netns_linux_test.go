package netns

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

const envdPort = 49983

var envdInside = hostPort(netip.MustParseAddr("169.254.0.21"), envdPort)

func TestHostReachesSandboxes(t *testing.T) {
	m, _ := newTestManager(t, 2)
	ctx := context.Background()
	a := acquire(t, m, SlotOptions{}) // no egress: inbound must work regardless
	b := acquire(t, m, SlotOptions{AllowInternet: true})
	if a.HostAddr == b.HostAddr || a.Name == b.Name || a.SandboxNSPath == b.SandboxNSPath {
		t.Fatalf("slots share identity: %+v %+v", a, b)
	}
	_, peersA := listenIn(t, a.SandboxNSPath, envdInside, "A")
	listenIn(t, b.SandboxNSPath, envdInside, "B")
	// Both sandboxes listen on the same inside address; each HostAddr must
	// lead to its own.
	mustReach(t, "", hostPort(a.HostAddr, envdPort), "A")
	mustReach(t, "", hostPort(b.HostAddr, envdPort), "B")
	mustReach(t, "", hostPort(a.HostAddr, envdPort), "A")
	// The sandbox sees the host's uplink address, not a rewritten one.
	if peer := <-peersA; !strings.HasPrefix(peer, a.hostPeer.Addr().String()+":") {
		t.Errorf("sandbox saw connection from %s, want %s", peer, a.hostPeer.Addr())
	}
	// Any port is forwarded, not just envd's.
	listenIn(t, a.SandboxNSPath, "169.254.0.21:8080", "A8080")
	mustReach(t, "", hostPort(a.HostAddr, 8080), "A8080")

	for _, s := range []*Slot{a, b} {
		if err := m.Release(ctx, s); err != nil {
			t.Fatalf("Release: %v", err)
		}
	}
	// Whatever is left of the slot while the kernel tears it down may
	// refuse the connection, but the sandbox must not answer.
	if got, err := dialFrom("", hostPort(a.HostAddr, envdPort), blockedTimeout); err == nil {
		t.Errorf("released slot still answers as %q", got)
	}
	if err := m.Release(ctx, a); !errors.Is(err, ErrNotHeld) {
		t.Errorf("second Release: %v, want ErrNotHeld", err)
	}
}

func TestSandboxNamespaceHoldsOnlyLoAndEth0(t *testing.T) {
	m, _ := newTestManager(t, 1)
	s := acquire(t, m, SlotOptions{})
	out, err := exec.Command("nsenter", "--net="+s.SandboxNSPath, "ip", "-o", "-4", "addr").CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr: %v: %s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "lo ") || !strings.Contains(lines[1], "eth0") ||
		!strings.Contains(lines[1], "169.254.0.21/30") {
		t.Errorf("sandbox addresses:\n%s", out)
	}
	out, err = exec.Command("nsenter", "--net="+s.SandboxNSPath, "ip", "-o", "link").CombinedOutput()
	if err != nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 1 ||
		!strings.Contains(string(out), "link/ether 02:ae:00:00:00:21") {
		t.Errorf("sandbox links (%v):\n%s", err, out)
	}
	out, err = exec.Command("nsenter", "--net="+s.SandboxNSPath, "ip", "route").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "default via 169.254.0.22 dev eth0") {
		t.Errorf("sandbox routes (%v):\n%s", err, out)
	}
}

func TestEgress(t *testing.T) {
	m, _ := newTestManager(t, 2)
	ctx := context.Background()
	inet := newTestNet(t)
	_, peers := listenIn(t, inet.path, hostPort(inet.addr, 8080), "internet")
	target := hostPort(inet.addr, 8080)

	open := acquire(t, m, SlotOptions{AllowInternet: true})
	closed := acquire(t, m, SlotOptions{})
	mustReach(t, open.SandboxNSPath, target, "internet")
	// Traffic leaves the host masqueraded behind the host's own address.
	if peer := <-peers; !strings.HasPrefix(peer, inet.hostAddr.String()+":") {
		t.Errorf("internet saw %s, want %s", peer, inet.hostAddr)
	}
	before, err := m.RefusedCount(closed)
	if err != nil {
		t.Fatal(err)
	}
	mustBeRefused(t, closed.SandboxNSPath, target)
	// The refusal is counted; the open slot refused nothing.
	if after, err := m.RefusedCount(closed); err != nil || after <= before {
		t.Errorf("closed slot's refusals: %d then %d (%v), want more after a refused connection", before, after, err)
	}
	if n, err := m.RefusedCount(open); err != nil || n != 0 {
		t.Errorf("open slot's refusals: %d (%v), want 0", n, err)
	}

	// Inbound still works on the closed slot: replies are not egress.
	listenIn(t, closed.SandboxNSPath, envdInside, "closed")
	mustReach(t, "", hostPort(closed.HostAddr, envdPort), "closed")

	t.Run("update", func(t *testing.T) {
		if err := m.UpdateEgress(ctx, closed, SlotOptions{AllowInternet: true}); err != nil {
			t.Fatal(err)
		}
		mustReach(t, closed.SandboxNSPath, target, "internet")
		if err := m.UpdateEgress(ctx, closed, SlotOptions{}); err != nil {
			t.Fatal(err)
		}
		mustNotReach(t, closed.SandboxNSPath, target)
	})
	t.Run("cidr", func(t *testing.T) {
		allowOne := SlotOptions{AllowOut: []netip.Prefix{netip.PrefixFrom(inet.addr, 32)}}
		if err := m.UpdateEgress(ctx, closed, allowOne); err != nil {
			t.Fatal(err)
		}
		mustReach(t, closed.SandboxNSPath, target, "internet")
		denyRange := SlotOptions{AllowInternet: true, DenyOut: []netip.Prefix{inet.prefix}}
		if err := m.UpdateEgress(ctx, closed, denyRange); err != nil {
			t.Fatal(err)
		}
		mustNotReach(t, closed.SandboxNSPath, target)
		// Allow wins over deny.
		both := SlotOptions{AllowOut: allowOne.AllowOut, DenyOut: denyRange.DenyOut}
		if err := m.UpdateEgress(ctx, closed, both); err != nil {
			t.Fatal(err)
		}
		mustReach(t, closed.SandboxNSPath, target, "internet")
		// The always-blocked ranges cannot be allowed.
		private := SlotOptions{AllowInternet: true, AllowOut: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
		if err := m.UpdateEgress(ctx, closed, private); err != nil {
			t.Fatal(err)
		}
		mustNotReach(t, closed.SandboxNSPath, hostPort(open.HostAddr, envdPort))
	})
	t.Run("acquire with options", func(t *testing.T) {
		s := acquire(t, m, SlotOptions{AllowOut: []netip.Prefix{inet.prefix}})
		mustReach(t, s.SandboxNSPath, target, "internet")
	})
}

// TestIsolation tries every way out of a sandbox that must stay shut, from
// a slot whose egress is open (so that only the isolation rules stop it).
func TestIsolation(t *testing.T) {
	m, _ := newTestManager(t, 2)
	inet := newTestNet(t)
	listenIn(t, inet.path, hostPort(inet.addr, 8080), "internet")
	a := acquire(t, m, SlotOptions{AllowInternet: true})
	b := acquire(t, m, SlotOptions{AllowInternet: true})
	listenIn(t, b.SandboxNSPath, envdInside, "B")
	// Listeners on the host, on its public-looking and on its slot-facing
	// addresses, and inside A's router.
	hostPub, _ := listenIn(t, "", hostPort(inet.hostAddr, 0), "host")
	hostUpA, _ := listenIn(t, "", hostPort(a.hostPeer.Addr(), 0), "host")
	hostUpB, _ := listenIn(t, "", hostPort(b.hostPeer.Addr(), 0), "host")
	router, _ := listenIn(t, a.RouterNSPath, "0.0.0.0:0", "router")

	cases := map[string]string{
		"other sandbox":          hostPort(b.HostAddr, envdPort),
		"host public address":    hostPort(inet.hostAddr, listenPort(hostPub)),
		"host uplink address":    hostPort(a.hostPeer.Addr(), listenPort(hostUpA)),
		"host other uplink":      hostPort(b.hostPeer.Addr(), listenPort(hostUpB)),
		"router gateway address": hostPort(gatewayAddr, listenPort(router)),
		"router uplink address":  hostPort(a.HostAddr, listenPort(router)),
	}
	// Sanity: egress is open, and every listener answers where it is
	// meant to (the host and the router can reach their own).
	mustReach(t, a.SandboxNSPath, hostPort(inet.addr, 8080), "internet")
	for name, addr := range cases {
		from, want := "", "host"
		switch {
		case strings.HasPrefix(name, "router"):
			from, want = a.RouterNSPath, "router"
		case name == "other sandbox":
			want = "B"
		}
		mustReach(t, from, addr, want)
	}

	var wg sync.WaitGroup
	for name, addr := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := unreachable(a.SandboxNSPath, addr); err != nil {
				t.Errorf("%s from the sandbox: %v", name, err)
			}
		}()
	}
	wg.Wait()

	// Nobody but the host opens connections into a slot: not the internet.
	mustNotReach(t, inet.path, hostPort(b.HostAddr, envdPort))
}

func TestConcurrentAcquire(t *testing.T) {
	m, _ := newTestManager(t, 2)
	ctx := context.Background()
	const n = 12
	slots := make([]*Slot, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := m.Acquire(ctx, SlotOptions{AllowInternet: i%2 == 0})
			if err != nil {
				t.Error(err)
				return
			}
			slots[i] = s
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	seen := map[netip.Addr]bool{}
	for _, s := range slots {
		if seen[s.HostAddr] {
			t.Fatalf("HostAddr %s handed out twice", s.HostAddr)
		}
		seen[s.HostAddr] = true
	}
	for i, s := range slots {
		listenIn(t, s.SandboxNSPath, envdInside, fmt.Sprint(i))
	}
	for i, s := range slots {
		mustReach(t, "", hostPort(s.HostAddr, envdPort), fmt.Sprint(i))
	}
	for _, s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.Release(ctx, s); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

func TestRecycle(t *testing.T) {
	m, _ := newUnfilledManager(t, 1)
	ctx := context.Background()
	inet := newTestNet(t)
	listenIn(t, inet.path, hostPort(inet.addr, 8080), "internet")

	s := acquire(t, m, SlotOptions{AllowInternet: true})
	listenIn(t, s.SandboxNSPath, envdInside, "first")
	mustReach(t, "", hostPort(s.HostAddr, envdPort), "first")
	mustReach(t, s.SandboxNSPath, hostPort(inet.addr, 8080), "internet")
	// A refusal (a private range is always refused) is counted, and the
	// count does not follow the slot to its next sandbox.
	mustBeRefused(t, s.SandboxNSPath, "10.0.0.1:80")
	if n, err := m.RefusedCount(s); err != nil || n == 0 {
		t.Fatalf("refusals after a refused connection: %d (%v), want some", n, err)
	}
	simulateRunsc(t, s)
	mustNotReach(t, "", hostPort(s.HostAddr, envdPort))

	if err := m.Recycle(ctx, s); err != nil {
		t.Fatalf("Recycle: %v", err)
	}
	r := acquire(t, m, SlotOptions{})
	if r != s {
		t.Fatalf("got slot %s, want the recycled %s", r.Name, s.Name)
	}
	listenIn(t, r.SandboxNSPath, "169.254.0.21:8080", "second")
	mustReach(t, "", hostPort(r.HostAddr, 8080), "second")
	if n, err := m.RefusedCount(r); err != nil || n != 0 {
		t.Errorf("refusals of the recycled slot: %d (%v), want 0", n, err)
	}
	// Egress was closed again.
	mustNotReach(t, r.SandboxNSPath, hostPort(inet.addr, 8080))

	t.Run("pool full", func(t *testing.T) {
		other := acquire(t, m, SlotOptions{})
		if err := m.Recycle(ctx, other); err != nil {
			t.Fatal(err)
		}
		if err := m.Recycle(ctx, r); err != nil {
			t.Fatal(err)
		}
		if m.poolLen() != 1 || fileExists(r.SandboxNSPath) {
			t.Fatalf("recycled into a full pool (pool %d)", m.poolLen())
		}
		acquire(t, m, SlotOptions{}) // empty the pool again
	})
	t.Run("namespace in use", func(t *testing.T) {
		s := acquire(t, m, SlotOptions{})
		holder := exec.Command("nsenter", "--net="+s.SandboxNSPath, "sleep", "30")
		if err := holder.Start(); err != nil {
			t.Fatal(err)
		}
		defer holder.Wait()
		defer holder.Process.Kill()
		deadline := time.Now().Add(5 * time.Second)
		for inUse, _ := nsInUse(s.SandboxNSPath); !inUse; inUse, _ = nsInUse(s.SandboxNSPath) {
			if time.Now().After(deadline) {
				t.Fatal("nsenter never entered the namespace")
			}
			time.Sleep(time.Millisecond)
		}
		if err := m.Recycle(ctx, s); err != nil {
			t.Fatalf("Recycle: %v", err)
		}
		if m.poolLen() != 0 || fileExists(s.SandboxNSPath) {
			t.Fatalf("a namespace still in use went back to the pool")
		}
	})
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
