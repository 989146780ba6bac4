package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"

	"github.com/aenvhq/aenv/internal/envd/spec/process"
	"github.com/aenvhq/aenv/internal/envd/spec/process/processconnect"
	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/template"
)

// TestMain fails the package's tests if a goroutine outlives them: the
// node's own (sampling, exits, the warm pool's refill) end with Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The fakes below stand in for the runtime driver and sandbox networking,
// so that the node's own logic (rollback, the warm pool, admission,
// recovery) runs without root. A fake sandbox is a real HTTP server
// answering envd's /health, /init, /envs and process starts (through
// envd's own Connect handler) at its slot's address: every
// address of 127.0.0.0/8 is the loopback, so each slot gets one of its
// own and envd's fixed port never collides.

// fakeEnvd is what the node reaches of a fake sandbox.
type fakeEnvd struct {
	srv *http.Server
	// failInit makes /init answer 500.
	failInit bool

	mu    sync.Mutex
	init  *initRequest // the last /init
	calls []string     // "init", and "start CMD ARGS..." for each process started
}

// fakeProcesses answers process starts: each ends at once, exit code 0.
type fakeProcesses struct {
	processconnect.UnimplementedProcessHandler
	e *fakeEnvd
}

func (p fakeProcesses) Start(ctx context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	cfg := req.Msg.GetProcess()
	p.e.record("start " + strings.Join(append([]string{cfg.GetCmd()}, cfg.GetArgs()...), " "))
	if err := st.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 2}}}}); err != nil {
		return err
	}
	return st.Send(&process.StartResponse{Event: &process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{Exited: true, Status: "exit status 0"}}}})
}

func startEnvd(addr netip.Addr, failInit bool) (*fakeEnvd, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(EnvdPort)))
	if err != nil {
		return nil, err
	}
	e := &fakeEnvd{failInit: failInit}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("POST /init", func(w http.ResponseWriter, r *http.Request) {
		var req initRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || e.failInit {
			http.Error(w, "init refused", http.StatusInternalServerError)
			return
		}
		e.mu.Lock()
		e.init = &req
		e.mu.Unlock()
		e.record("init")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.Handle(processconnect.NewProcessHandler(fakeProcesses{e: e}))
	e.srv = &http.Server{Handler: mux}
	go e.srv.Serve(l)
	return e, nil
}

func (e *fakeEnvd) lastInit() *initRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.init
}

func (e *fakeEnvd) record(call string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, call)
}

// history is what the node asked of this envd, in order.
func (e *fakeEnvd) history() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.calls)
}

func (e *fakeEnvd) stop() { e.srv.Close() }

// fakeRuntime runs fake sandboxes. It outlives the nodes that use it, as
// runsc's sandboxes outlive the node process (Recoverer).
type fakeRuntime struct {
	exits chan runtime.Exit

	mu      sync.Mutex
	running map[string]*fakeEnvd
	specs   map[string]runtime.Spec
	creates int
	// failCreate fails the next creates; noEnvd starts sandboxes whose
	// envd never answers; failInit, whose envd refuses /init.
	failCreate, noEnvd, failInit bool
	// adopted are the sandboxes Recover took over since the last restart.
	adopted []string
	// gate, when set, holds every create until it is closed; inFlight
	// counts the creates under way, maxInFlight the most at once.
	gate                  chan struct{}
	inFlight, maxInFlight int
	// cpu is CPU time each sandbox used, on top of a constant start.
	cpu map[string]time.Duration
	// foregrounded counts Foreground's calls by sandbox; failForeground
	// fails them.
	foregrounded   map[string]int
	failForeground bool
}

var (
	_ runtime.Runtime      = (*fakeRuntime)(nil)
	_ runtime.Recoverer    = (*fakeRuntime)(nil)
	_ runtime.ExitNotifier = (*fakeRuntime)(nil)
	_ runtime.Foregrounder = (*fakeRuntime)(nil)
)

func newFakeRuntime(t *testing.T) *fakeRuntime {
	r := &fakeRuntime{exits: make(chan runtime.Exit, 16), running: map[string]*fakeEnvd{}, specs: map[string]runtime.Spec{},
		foregrounded: map[string]int{}}
	t.Cleanup(func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, e := range r.running {
			if e != nil {
				e.stop()
			}
		}
	})
	return r
}

func (r *fakeRuntime) Name() string                       { return "fake" }
func (r *fakeRuntime) Capabilities() runtime.Capabilities { return runtime.Capabilities{} }
func (r *fakeRuntime) Exits() <-chan runtime.Exit         { return r.exits }

// spec returns the spec sandbox id was created with.
func (r *fakeRuntime) spec(id string) runtime.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.specs[id]
}

func (r *fakeRuntime) Create(ctx context.Context, spec runtime.Spec) error {
	r.mu.Lock()
	gate := r.gate
	r.inFlight++
	r.maxInFlight = max(r.maxInFlight, r.inFlight)
	r.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inFlight--
	if r.failCreate {
		return errors.New("fake runtime: create failed on purpose")
	}
	if _, ok := r.running[spec.ID]; ok {
		return fmt.Errorf("fake runtime: %s exists", spec.ID)
	}
	var e *fakeEnvd
	if !r.noEnvd {
		var err error
		if e, err = startEnvd(spec.HostAddr, r.failInit); err != nil {
			return err
		}
	}
	r.running[spec.ID] = e
	r.specs[spec.ID] = spec
	r.creates++
	return nil
}

func (r *fakeRuntime) Kill(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.running[id]
	if !ok {
		return fmt.Errorf("fake runtime: killing %s: %w", id, runtime.ErrNotFound)
	}
	if e != nil {
		e.stop()
	}
	delete(r.running, id)
	return nil
}

func (r *fakeRuntime) Foreground(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.running[id]; !ok {
		return fmt.Errorf("fake runtime: foregrounding %s: %w", id, runtime.ErrNotFound)
	}
	if r.failForeground {
		return fmt.Errorf("fake runtime: foregrounding %s: failing as told", id)
	}
	r.foregrounded[id]++
	return nil
}

// isRunning says whether sandbox id runs.
func (r *fakeRuntime) isRunning(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.running[id]
	return ok
}

// foregrounds is how many times sandbox id was foregrounded.
func (r *fakeRuntime) foregrounds(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.foregrounded[id]
}

func (r *fakeRuntime) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.running[id]; !ok {
		return runtime.Stats{}, runtime.ErrNotFound
	}
	return runtime.Stats{CPUUsageNanos: 1e6 + uint64(r.cpu[id]), MemoryBytes: 64 << 20}, nil
}

func (r *fakeRuntime) Leftovers(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.running)), nil
}

func (r *fakeRuntime) Recover(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.running[id]; !ok {
		return runtime.ErrNotFound
	}
	r.adopted = append(r.adopted, id)
	return nil
}

// crash makes sandbox id die on its own, as the driver reports it.
func (r *fakeRuntime) crash(id string, oom bool) {
	r.mu.Lock()
	if e := r.running[id]; e != nil {
		e.stop()
	}
	delete(r.running, id)
	r.mu.Unlock()
	r.exits <- runtime.Exit{ID: id, OutOfMemory: oom}
}

// envdOf is sandbox id's envd, nil if it does not run (or has none).
func (r *fakeRuntime) envdOf(id string) *fakeEnvd {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running[id]
}

func (r *fakeRuntime) ids() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.running))
}

func (r *fakeRuntime) createCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.creates
}

func (r *fakeRuntime) set(fn func(r *fakeRuntime)) {
	r.mu.Lock()
	fn(r)
	r.mu.Unlock()
}

// fakeNetwork hands out slots of loopback addresses. Like the netns
// manager, it keeps its slots across a restart of the node process
// (restart), for the next node to Adopt.
type fakeNetwork struct {
	base [2]byte

	mu     sync.Mutex
	next   int
	held   map[string]*netns.Slot
	egress map[string]netns.SlotOptions
	// fail fails the next acquires.
	fail bool
	// adopted since the last restart.
	adopted map[string]bool
	// leftoversReleased counts ReleaseLeftovers calls.
	leftoversReleased int
	// packets are the slots' packet counts (PacketCount), by name.
	packets map[string]uint64
}

func newFakeNetwork() *fakeNetwork {
	// A range of 127/8 of its own per test process: nothing else of this
	// host answers at envd's port there.
	return &fakeNetwork{base: [2]byte{byte(100 + rand.IntN(100)), byte(rand.IntN(250))},
		held: map[string]*netns.Slot{}, egress: map[string]netns.SlotOptions{}, adopted: map[string]bool{}}
}

// PacketCount is netns.Manager's.
func (f *fakeNetwork) PacketCount(s *netns.Slot) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.packets[s.Name], nil
}

func (f *fakeNetwork) Acquire(ctx context.Context, opts netns.SlotOptions) (*netns.Slot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return nil, errors.New("fake network: no slot on purpose")
	}
	f.next++
	name := fmt.Sprintf("slot%d", f.next)
	s := &netns.Slot{Name: name, Index: f.next, HostAddr: netip.AddrFrom4([4]byte{127, f.base[0], f.base[1] + byte(f.next/250), byte(1 + f.next%250)})}
	f.held[name] = s
	f.egress[name] = opts
	return s, nil
}

func (f *fakeNetwork) UpdateEgress(ctx context.Context, s *netns.Slot, opts netns.SlotOptions) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held[s.Name] != s {
		return fmt.Errorf("fake network: updating slot %s, not held", s.Name)
	}
	f.egress[s.Name] = opts
	return nil
}

func (f *fakeNetwork) Release(ctx context.Context, s *netns.Slot) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s == nil || f.held[s.Name] != s {
		return fmt.Errorf("fake network: releasing a slot not held: %v", s)
	}
	delete(f.held, s.Name)
	delete(f.egress, s.Name)
	return nil
}

func (f *fakeNetwork) Adopt(name string) (*netns.Slot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.held[name]
	if !ok || f.adopted[name] {
		return nil, fmt.Errorf("fake network: no slot %q to adopt", name)
	}
	f.adopted[name] = true
	return s, nil
}

func (f *fakeNetwork) ReleaseLeftovers(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leftoversReleased++
	for name := range f.held {
		if !f.adopted[name] {
			delete(f.held, name)
			delete(f.egress, name)
		}
	}
	return nil
}

// restart is the node process going away: its slots stay, for the next
// one to adopt.
func (f *fakeNetwork) restart() {
	f.mu.Lock()
	f.adopted = map[string]bool{}
	f.mu.Unlock()
}

func (f *fakeNetwork) heldCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}

func (f *fakeNetwork) egressOf(name string) netns.SlotOptions {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.egress[name]
}

func (f *fakeNetwork) set(fn func(f *fakeNetwork)) {
	f.mu.Lock()
	fn(f)
	f.mu.Unlock()
}

// fakeRootFS serves every template from its directory, and counts what
// it holds.
type fakeRootFS struct {
	mu   sync.Mutex
	held map[string]bool
	fail bool
}

func (p *fakeRootFS) Prepare(_ context.Context, tpl *template.Template, id string, _ []runtime.Bind) (runtime.RootFS, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail {
		return runtime.RootFS{}, errors.New("fake rootfs: no root filesystem on purpose")
	}
	p.held[id] = true
	return runtime.RootFS{Dir: tpl.RootFS}, nil
}

func (p *fakeRootFS) Release(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.held, id)
	return nil
}

func (p *fakeRootFS) Serves(*template.Template) bool { return false }

func (p *fakeRootFS) Sync(_ context.Context, live []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.held {
		if !slices.Contains(live, id) {
			delete(p.held, id)
		}
	}
	return nil
}

func (p *fakeRootFS) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// fakeLoad is the host's load as a test sets it: by default 1 GiB, a
// tenth of it used, CPUs idle.
type fakeLoad struct {
	mu    sync.Mutex
	total uint64
	used  float64
	busy  float64
	// perSandbox, when set, adds to used what the sandboxes take.
	perSandbox func() float64
	// cpuReads counts cpuBusy calls.
	cpuReads int
}

func newFakeLoad() *fakeLoad { return &fakeLoad{total: 1 << 30, used: 0.1} }

func (l *fakeLoad) memory() (uint64, float64) {
	l.mu.Lock()
	total, used, per := l.total, l.used, l.perSandbox
	l.mu.Unlock()
	if per != nil {
		used += per()
	}
	return total, used
}

func (l *fakeLoad) cpuBusy() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cpuReads++
	return l.busy
}

func (l *fakeLoad) set(fn func(l *fakeLoad)) {
	l.mu.Lock()
	fn(l)
	l.mu.Unlock()
}

// fakeClock is a time the test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)} }

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testTemplate is the template the tests' sandboxes run.
const testTemplate = "tiny"

// host is what a test node runs on: runtime, network and root
// filesystems, which outlive the node processes started on them.
type host struct {
	t        *testing.T
	rt       *fakeRuntime
	net      *fakeNetwork
	rootfs   *fakeRootFS
	tpls     *template.Catalog
	stateDir string
	load     *fakeLoad
	clock    *fakeClock
}

func newHost(t *testing.T) *host {
	root := t.TempDir()
	tpls, err := template.NewCatalog(template.CatalogOptions{Dir: filepath.Join(root, "templates"), Logger: slog.New(slog.DiscardHandler),
		Builtins: []*template.Template{{ID: testTemplate, Aliases: []string{"tiny-alias"}, CPUCount: 1, MemoryMB: 256, RootFS: filepath.Join(root, "rootfs")}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "rootfs"), 0o755); err != nil {
		t.Fatal(err)
	}
	return &host{t: t, rt: newFakeRuntime(t), net: newFakeNetwork(), rootfs: &fakeRootFS{held: map[string]bool{}},
		tpls: tpls, stateDir: filepath.Join(root, "state"), load: newFakeLoad(), clock: newFakeClock()}
}

// config is a node of h: 2 CPUs and 1 GiB without overcommit, whatever
// the host's memory, CPUs and disk really hold (the tests are about the
// rule's use, not this machine), and no warm pool.
func (h *host) config() Config {
	return Config{
		ID: "n1", Runtime: h.rt, Network: h.net, Templates: h.tpls, RootFS: h.rootfs,
		EnvdPath: "/nonexistent/envd", EnvdVersion: "test", StateDir: h.stateDir,
		ReadyTimeout: 2 * time.Second, DiskMB: -1,
		Capacity:       Capacity{MemoryMB: 1024, CPUCount: 2, MemoryOvercommit: 1, MemoryHighWater: 1, DiskHighWater: 1},
		Logger:         slog.New(slog.DiscardHandler),
		WarmPoolMemory: -1,
		load:           h.load, clock: h.clock.now,
	}
}

// start starts a node of cfg on h, closed (keeping its sandboxes, as a
// restart does) when the test ends unless the test closed it first.
func (h *host) start(cfg Config) (*Node, []*Sandbox) {
	h.t.Helper()
	n, err := New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() {
		if n.bg.Err() == nil { // not closed by the test
			n.Close(context.Background(), KillSandboxes)
		}
	})
	kept, err := n.Start(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return n, kept
}

// empty fails the test unless nothing of any sandbox is held: no runtime
// sandbox, slot, root filesystem or local record.
func (h *host) empty(what string) {
	h.t.Helper()
	if ids := h.rt.ids(); len(ids) > 0 {
		h.t.Errorf("%s: the runtime runs %v", what, ids)
	}
	if n := h.net.heldCount(); n > 0 {
		h.t.Errorf("%s: %d network slots held", what, n)
	}
	if n := h.rootfs.heldCount(); n > 0 {
		h.t.Errorf("%s: %d root filesystems held", what, n)
	}
	if files, _ := filepath.Glob(filepath.Join(h.stateDir, "sandboxes", "*.json")); len(files) > 0 {
		h.t.Errorf("%s: local records %v", what, files)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
