package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/testutil"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// blockedTimeout bounds a dial that is expected to be dropped.
const blockedTimeout = 300 * time.Millisecond

var testSeq atomic.Int32

// testConfig returns a config of its own for each call: a fresh run
// directory, a tag no other test's tag starts with ("nt" + two letters) and
// a /24 of 10.220.0.0/16, so that tests (and a real aenv on this host) do
// not see each other's slots.
func testConfig(t testing.TB, poolSize int) Config {
	n := int(testSeq.Add(1)) + 26*(os.Getpid()%26)
	tag := fmt.Sprintf("nt%c%c", 'a'+(n/26)%26, 'a'+n%26)
	return Config{
		RunDir:   t.TempDir() + "/netns",
		Prefix:   netip.MustParsePrefix(fmt.Sprintf("10.220.%d.0/24", n%256)),
		Tag:      tag,
		PoolSize: poolSize,
	}
}

// newTestManager starts a Manager that is closed when the test ends.
func newTestManager(t testing.TB, poolSize int) (*Manager, Config) {
	t.Helper()
	return startTestManager(t, poolSize, true)
}

// newUnfilledManager is newTestManager with no pool filler: only Recycle
// puts slots into the pool.
func newUnfilledManager(t testing.TB, poolSize int) (*Manager, Config) {
	t.Helper()
	return startTestManager(t, poolSize, false)
}

func startTestManager(t testing.TB, poolSize int, fill bool) (*Manager, Config) {
	t.Helper()
	testutil.RequireRoot(t)
	cfg := testConfig(t, poolSize)
	m, err := newManager(context.Background(), cfg, fill)
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m, m.cfg
}

func acquire(t testing.TB, m *Manager, opts SlotOptions) *Slot {
	t.Helper()
	s, err := m.Acquire(context.Background(), opts)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return s
}

// inNetNS runs fn on a thread inside the namespace at path. Sockets made by
// fn stay in that namespace afterwards.
func inNetNS(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		target, err := vnetns.GetFromPath(path)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer target.Close()
		if err := vnetns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		ferr := fn()
		if err := vnetns.Set(orig); err != nil {
			errc <- fmt.Errorf("returning from %s: %w", path, err) // thread stays locked and dies
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// listenIn listens on addr inside the namespace at path ("" = the test's
// own namespace) and answers every connection with name, a newline, and an
// echo of what it receives. It reports the remote address of each
// connection on the returned channel.
func listenIn(t testing.TB, path, addr, name string) (net.Listener, <-chan string) {
	t.Helper()
	var l net.Listener
	listen := func() (err error) { l, err = net.Listen("tcp4", addr); return err }
	var err error
	if path == "" {
		err = listen()
	} else {
		err = inNetNS(path, listen)
	}
	if err != nil {
		t.Fatalf("listening on %s in %q: %v", addr, path, err)
	}
	t.Cleanup(func() { l.Close() })
	peers := make(chan string, 64)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case peers <- c.RemoteAddr().String():
			default:
			}
			go func() {
				defer c.Close()
				fmt.Fprintf(c, "%s\n", name)
				io.Copy(c, c)
			}()
		}
	}()
	return l, peers
}

// dialFrom connects to addr from inside the namespace at path ("" = the
// test's own namespace), checks the greeting and an echo, and returns the
// greeting (the listener's name).
func dialFrom(path, addr string, timeout time.Duration) (string, error) {
	var c net.Conn
	dial := func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, timeout)
		return err
	}
	var err error
	if path == "" {
		err = dial()
	} else {
		err = inNetNS(path, dial)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	r := bufio.NewReader(c)
	name, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("reading greeting: %w", err)
	}
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return "", err
	}
	echo, err := r.ReadString('\n')
	if err != nil || echo != "ping\n" {
		return "", fmt.Errorf("echo: %q, %v", echo, err)
	}
	return strings.TrimSuffix(name, "\n"), nil
}

func mustReach(t testing.TB, from, addr, want string) {
	t.Helper()
	got, err := dialFrom(from, addr, 2*time.Second)
	if err != nil {
		t.Fatalf("from %q: dialing %s: %v", from, addr, err)
	}
	if got != want {
		t.Fatalf("from %q: %s answered as %q, want %q", from, addr, got, want)
	}
}

func mustNotReach(t testing.TB, from, addr string) {
	t.Helper()
	if err := unreachable(from, addr); err != nil {
		t.Fatalf("from %q: %v", from, err)
	}
}

// unreachable checks that a connection to addr, where something listens,
// goes nowhere: a router rule refuses it (a reset: what sandboxes get), a
// rule drops it (a timeout: what the host gets dialling into a slot), or
// it finds no route.
func unreachable(from, addr string) error {
	got, err := dialFrom(from, addr, blockedTimeout)
	if err == nil {
		return fmt.Errorf("%s answered as %q; want it unreachable", addr, got)
	}
	return nil
}

// mustBeRefused checks that a sandbox's connection to addr (where
// something listens) is refused by its router at once, not left to time
// out.
func mustBeRefused(t testing.TB, from, addr string) {
	t.Helper()
	start := time.Now()
	_, err := dialFrom(from, addr, 2*time.Second)
	if !errors.Is(err, unix.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Fatalf("from %q: dialing %s: %v after %v; want it refused at once", from, addr, err, time.Since(start))
	}
}

// testNet is a namespace standing in for the internet: joined to the host
// by a veth in 198.18.0.0/15 (the benchmarking range, not one of the
// blocked ones), with a default route via the host.
type testNet struct {
	path     string       // the namespace, bind-mounted
	hostAddr netip.Addr   // host side of the veth
	addr     netip.Addr   // this namespace's address
	hostIf   string       // host-side interface
	prefix   netip.Prefix // the veth's /30
}

func newTestNet(t testing.TB) *testNet {
	t.Helper()
	n := int(testSeq.Add(1))
	tn := &testNet{
		path:     t.TempDir() + "/inet",
		hostAddr: netip.AddrFrom4([4]byte{198, 18, byte(n), 1}),
		addr:     netip.AddrFrom4([4]byte{198, 18, byte(n), 2}),
		hostIf:   fmt.Sprintf("xinet%d", n),
		prefix:   netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(n), 0}), 30),
	}
	nss, err := newNamespaces() // a pair; the router half serves
	if err != nil {
		t.Fatal(err)
	}
	defer nss.close()
	if err := bindNS(nss.router, tn.path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deleteLink(tn.hostIf)
		unbindNS(tn.path)
	})
	la := netlink.NewLinkAttrs()
	la.Name = tn.hostIf
	la.Flags = net.FlagUp
	veth := &netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(nss.router.Fd())}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(veth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(tn.hostAddr, 30))}); err != nil {
		t.Fatal(err)
	}
	h := nss.routerNL
	eth0, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []error{
		h.LinkSetUp(eth0),
		h.AddrAdd(eth0, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(tn.addr, 30))}),
		h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: tn.hostAddr.AsSlice()}),
		h.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: loopbackIndex}}),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	return tn
}

func hostPort(a netip.Addr, port int) string {
	return netip.AddrPortFrom(a, uint16(port)).String()
}

// listenPort returns the port a listener got.
func listenPort(l net.Listener) int { return l.Addr().(*net.TCPAddr).Port }

// simulateRunsc does to the sandbox namespace what runsc --network=sandbox
// does on start: it takes the addresses (and so the routes) off eth0.
func simulateRunsc(t testing.TB, s *Slot) {
	t.Helper()
	h, err := handleAt(s.SandboxNSPath, unix.NETLINK_ROUTE)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth0, err := h.LinkByName(SandboxIfName)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if err := h.AddrDel(eth0, &a); err != nil {
			t.Fatal(err)
		}
	}
}

// hostState is what this package can leave on the host for one config.
type hostState struct {
	files, mounts, links int
	table                bool
}

func readHostState(t testing.TB, cfg Config) hostState {
	t.Helper()
	var st hostState
	entries, _ := os.ReadDir(cfg.RunDir)
	for _, e := range entries {
		if e.Name() != selfBoundMarker {
			st.files++
		}
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], cfg.RunDir+"/") {
			st.mounts++
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, cfg.Tag) {
			st.links++
		}
	}
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list tables: %v: %s", err, out)
	}
	st.table = strings.Contains(string(out), "table inet "+cfg.Tag+"\n")
	return st
}

// waitHostState polls until the host state is want (background deletions
// take tens of milliseconds) and fails the test after a few seconds.
func waitHostState(t testing.TB, cfg Config, want hostState) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := readHostState(t, cfg)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("host state %+v, want %+v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// poolLen is the number of ready slots.
func (m *Manager) poolLen() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pool)
}

// waitPool waits until the pool holds n slots.
func waitPool(t testing.TB, m *Manager, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for m.poolLen() != n {
		if time.Now().After(deadline) {
			t.Fatalf("pool has %d slots, want %d", m.poolLen(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
