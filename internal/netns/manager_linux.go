package netns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// refillBackoff is how long the pool waits after a failed build.
const refillBackoff = time.Second

// deleteParallelism bounds concurrent interface deletions. Each mostly
// waits for RCU grace periods, so many can overlap.
const deleteParallelism = 32

// Manager owns the network slots of one host: their indexes, the pool of
// ready slots and the host-side rules. It is safe for concurrent use.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	slots     int      // number of indexes in cfg.Prefix
	lock      *os.File // flock on RunDir
	selfBound bool     // RunDir was bind-mounted onto itself by us

	mu       sync.Mutex
	closed   bool
	poolSize int    // target number of ready slots
	used     []bool // index -> allocated (pooled, held, being built, or unusable)
	next     int    // next index to try: indexes are reused as late as possible
	pool     []*Slot
	held     map[*Slot]struct{}
	filling  int // pool builds in flight
	// leftovers are intact slots of an earlier manager, kept for Adopt
	// (Config.KeepLeftovers), by name.
	leftovers map[string]*Slot

	ops    sync.WaitGroup // builds and destroys in flight, awaited by Close
	dels   chan struct{}  // semaphore of background interface deletions
	refill chan struct{}
	stop   context.CancelFunc
	done   chan struct{}
}

// NewManager reaps what a previous run left (see Reap), enables forwarding
// on the host, installs the host-side nftables table and starts filling the
// pool. ip_forward is left on by Close: other users of the host may rely on
// it.
func NewManager(ctx context.Context, cfg Config) (*Manager, error) {
	return newManager(ctx, cfg, true)
}

// newManager is NewManager; without fill, nothing but Recycle puts slots
// into the pool (for tests that need to know what is in it).
func newManager(ctx context.Context, cfg Config, fill bool) (*Manager, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	lock, err := lockDir(cfg.RunDir)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg:      cfg,
		log:      cfg.Logger,
		slots:    cfg.slotCount(),
		lock:     lock,
		held:     map[*Slot]struct{}{},
		poolSize: max(cfg.PoolSize, 0),
		refill:   make(chan struct{}, 1),
		dels:     make(chan struct{}, deleteParallelism),
		done:     make(chan struct{}),
	}
	m.used = make([]bool, m.slots)
	fail := func(err error) (*Manager, error) {
		if m.selfBound {
			unix.Unmount(cfg.RunDir, unix.MNT_DETACH)
		}
		lock.Close()
		return nil, fmt.Errorf("starting netns manager: %w", err)
	}
	kept, err := reap(ctx, cfg, cfg.KeepLeftovers)
	if err != nil {
		return fail(err)
	}
	if err := checkPrefixFree(cfg); err != nil {
		return fail(err)
	}
	m.leftovers = map[string]*Slot{}
	for _, s := range kept {
		m.used[s.Index] = true
		m.leftovers[s.Name] = s
	}
	if m.selfBound, err = makeSharedDir(cfg.RunDir); err != nil {
		return fail(err)
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0); err != nil {
		return fail(fmt.Errorf("enabling forwarding: %w", err))
	}
	if err := installHostTable(cfg); err != nil {
		return fail(err)
	}
	bg, stop := context.WithCancel(context.Background())
	m.stop = stop
	if !fill {
		close(m.done)
		return m, nil
	}
	go m.fill(bg)
	m.kick()
	return m, nil
}

// Acquire returns a slot whose egress follows opts, from the pool when it
// has one, else built on the spot. The caller owns the slot until Release
// or Recycle.
func (m *Manager) Acquire(ctx context.Context, opts SlotOptions) (*Slot, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("acquiring slot: %w", err)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("acquiring slot: %w", ErrClosed)
	}
	var s *Slot
	if n := len(m.pool); n > 0 {
		s, m.pool = m.pool[n-1], m.pool[:n-1]
	}
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()
	// Refill once this slot is ready: a build competes for the CPU and the
	// kernel's locks with the work below.
	defer m.kick()

	if s == nil {
		var err error
		if s, err = m.build(); err != nil {
			return nil, fmt.Errorf("acquiring slot: %w", err)
		}
	}
	// Pooled and new slots alike come with an empty egress chain, which
	// denies everything.
	if !opts.denyAll() {
		if err := setEgress(m.cfg.Tag, s, opts, m.cfg.DNSServers); err != nil {
			m.destroy(s)
			return nil, fmt.Errorf("acquiring slot: %w", err)
		}
	}
	if len(opts.AllowDomains) > 0 {
		if err := m.applyDomains(s, opts); err != nil {
			m.destroy(s)
			return nil, fmt.Errorf("acquiring slot: %w", err)
		}
	}
	s.dropNFT() // held slots keep no sockets
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.destroy(s)
		return nil, fmt.Errorf("acquiring slot: %w", ErrClosed)
	}
	m.held[s] = struct{}{}
	m.mu.Unlock()
	return s, nil
}

// UpdateEgress replaces the egress policy of a held slot. Connections
// already established are not cut.
func (m *Manager) UpdateEgress(ctx context.Context, s *Slot, opts SlotOptions) error {
	m.mu.Lock()
	_, ok := m.held[s]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("updating egress of %s: %w", s.Name, ErrNotHeld)
	}
	if err := setEgress(m.cfg.Tag, s, opts, m.cfg.DNSServers); err != nil {
		return err
	}
	return m.applyDomains(s, opts)
}

// Release destroys a held slot: namespaces, interfaces and rules. When it
// returns, the slot is cut off from the host and its namespace files are
// gone; the host-side interface is deleted in the background within tens of
// milliseconds, and the slot's index is free again after that. Once Close has begun, Release returns ErrClosed and
// Close destroys the slot.
func (m *Manager) Release(ctx context.Context, s *Slot) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("releasing slot %s: %w", s.Name, ErrClosed)
	}
	if _, ok := m.held[s]; !ok {
		m.mu.Unlock()
		return fmt.Errorf("releasing slot %s: %w", s.Name, ErrNotHeld)
	}
	delete(m.held, s)
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()
	return m.destroy(s)
}

// Recycle returns a held slot to the pool instead of destroying it, once
// its sandbox has exited: eth0's address and default route (which runsc
// removed) are put back, the router's connection tracking is flushed and
// egress is closed again. A slot whose sandbox namespace some process still
// uses, or that cannot be reset, or that the pool has no room for, is
// destroyed instead, as by Release.
func (m *Manager) Recycle(ctx context.Context, s *Slot) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return fmt.Errorf("recycling slot %s: %w", s.Name, ErrClosed)
	}
	if _, ok := m.held[s]; !ok {
		m.mu.Unlock()
		return fmt.Errorf("recycling slot %s: %w", s.Name, ErrNotHeld)
	}
	delete(m.held, s)
	room := len(m.pool)+m.filling < m.poolSize
	if room {
		m.filling++ // reserve the place in the pool
	}
	m.ops.Add(1)
	m.mu.Unlock()
	defer m.ops.Done()
	if !room {
		return m.destroy(s)
	}
	s.stopProxy()
	err := resetSlot(m.cfg.Tag, s)
	if err == nil {
		err = m.applyDomains(s, SlotOptions{}) // no redirect left for the next sandbox
	}
	if err != nil {
		m.log.Warn("recycling network slot failed, destroying it", "slot", s.Name, "err", err)
	}
	m.mu.Lock()
	m.filling--
	if err == nil && !m.closed {
		m.pool = append(m.pool, s)
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()
	return m.destroy(s)
}

// Close destroys every slot the Manager still has, pooled or held, then
// removes the host-side table. Held slots go too because without the host
// rules their sandboxes would no longer be isolated from the host.
func (m *Manager) Close(ctx context.Context) error {
	if !m.shutDown() {
		return nil
	}

	m.mu.Lock()
	slots := m.pool
	for s := range m.held {
		slots = append(slots, s)
	}
	for _, s := range m.leftovers {
		slots = append(slots, s)
	}
	m.pool, m.held, m.leftovers = nil, map[*Slot]struct{}{}, nil
	m.mu.Unlock()

	var errs []error
	for _, s := range slots {
		if err := m.destroy(s); err != nil {
			errs = append(errs, err)
		}
	}
	m.ops.Wait() // the interface deletions destroy started
	if err := removeHostTable(m.cfg.Tag); err != nil {
		errs = append(errs, err)
	}
	if m.selfBound {
		os.Remove(filepath.Join(m.cfg.RunDir, selfBoundMarker))
		if err := unix.Unmount(m.cfg.RunDir, unix.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Errorf("unmounting run directory %s: %w", m.cfg.RunDir, err))
		}
	}
	if err := m.lock.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("closing netns manager: %w", err)
	}
	return nil
}

// shutDown marks the manager closed and waits for the pool filler and
// every build and destroy in flight; false if it was closed already.
func (m *Manager) shutDown() bool {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return false
	}
	m.closed = true
	m.mu.Unlock()
	m.stop()
	<-m.done
	m.ops.Wait()
	return true
}

// build allocates an index and builds a slot on it.
func (m *Manager) build() (*Slot, error) {
	index, err := m.allocIndex()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	cfg := m.cfg // SetHostNetworks may change it
	m.mu.Unlock()
	s, err := buildSlot(cfg, index)
	if err != nil {
		m.freeIndex(index, !errors.Is(err, errLeftovers))
		return nil, err
	}
	return s, nil
}

// destroy cuts s off and removes its namespaces at once, then deletes its
// host-side interface in the background (the kernel takes tens of
// milliseconds to do that, mostly waiting) and only then frees its index,
// so that nothing is built on top of remains. The index of a slot that
// could not be fully destroyed stays allocated. Close waits for the
// background work.
func (m *Manager) destroy(s *Slot) error {
	s.stopProxy()
	err := detachSlot(s)
	if err != nil {
		m.log.Error("network slot left behind", "slot", s.Name, "err", err)
	}
	m.ops.Add(1)
	go func() {
		defer m.ops.Done()
		m.dels <- struct{}{}
		lerr := deleteLink(s.hostIf)
		<-m.dels
		if lerr != nil {
			m.log.Error("network slot interface left behind", "slot", s.Name, "err", lerr)
		}
		m.freeIndex(s.Index, err == nil && lerr == nil)
	}()
	return err
}

func (m *Manager) allocIndex() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, ErrClosed
	}
	for range m.slots {
		i := m.next
		m.next = (m.next + 1) % m.slots
		if !m.used[i] {
			m.used[i] = true
			return i, nil
		}
	}
	return 0, ErrExhausted
}

func (m *Manager) freeIndex(i int, clean bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used[i] = !clean
}

// kick wakes the pool filler without blocking.
func (m *Manager) kick() {
	select {
	case m.refill <- struct{}{}:
	default:
	}
}

// fill keeps the pool at its size until ctx ends. Builds run one at a time
// (about 7 ms each here, mostly kernel CPU time): enough to keep up with
// 100 acquisitions a second without crowding out the sandboxes.
func (m *Manager) fill(ctx context.Context) {
	defer close(m.done)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.refill:
		}
		for ctx.Err() == nil {
			m.mu.Lock()
			need := !m.closed && len(m.pool)+m.filling < m.poolSize
			if need {
				m.filling++
				m.ops.Add(1)
			}
			m.mu.Unlock()
			if !need {
				break
			}
			s, err := m.build()
			m.mu.Lock()
			m.filling--
			late := err == nil && m.closed
			if err == nil && !late {
				m.pool = append(m.pool, s)
			}
			m.mu.Unlock()
			if late {
				m.destroy(s)
			}
			m.ops.Done()
			if err != nil {
				m.log.Warn("filling network slot pool", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(refillBackoff):
				}
			}
		}
	}
}

// resetSlot makes a used slot as good as new; see Recycle.
func resetSlot(tag string, s *Slot) error {
	inUse, err := nsInUse(s.SandboxNSPath)
	if err != nil {
		return err
	}
	if inUse {
		return fmt.Errorf("resetting slot %s: sandbox namespace still in use", s.Name)
	}
	sh, err := handleAt(s.SandboxNSPath, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("resetting slot %s: %w", s.Name, err)
	}
	defer sh.Close()
	if err := configureSandbox(sh, true); err != nil {
		return fmt.Errorf("resetting slot %s: %w", s.Name, err)
	}
	rh, err := handleAt(s.RouterNSPath, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("resetting slot %s: %w", s.Name, err)
	}
	defer rh.Close()
	if err := rh.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		return fmt.Errorf("resetting slot %s: flushing connection tracking: %w", s.Name, err)
	}
	if s.nft, err = nftAt(s.RouterNSPath); err != nil { // kept for the next Acquire
		return fmt.Errorf("resetting slot %s: %w", s.Name, err)
	}
	// The next sandbox's refusals count from zero, not on from its
	// predecessor's (which its history would report as its own). A router
	// from before the named counter has none to reset.
	t := hostTable(tag)
	if _, err := s.nft.ResetObject(refusedCounterIn(t)); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("resetting slot %s: its count of refusals: %w", s.Name, err)
	}
	return setEgress(tag, s, SlotOptions{}, nil)
}

// handleAt opens a netlink handle of the given family in the namespace at
// path.
func handleAt(path string, family int) (*netlink.Handle, error) {
	ns, err := openNS(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(vnetns.NsHandle(ns.Fd()), family)
	if err != nil {
		return nil, fmt.Errorf("opening netlink in %s: %w", path, err)
	}
	return h, nil
}
