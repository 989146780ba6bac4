package state

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// memoryLogSize bounds the event log so a long test does not grow without
// limit; a watcher that falls further behind gets ErrCompacted, as it
// would from etcd after a compaction.
const memoryLogSize = 10000

// NewMemory returns a Store that lives in this process's memory. It is for
// unit tests only: nothing survives the process and nothing is shared
// between processes. It keeps etcd's semantics (revisions, leases that
// expire, FIFO elections) so tests written against it hold for Open.
// It is safe for concurrent use.
func NewMemory() Store {
	return newMemory(memoryLogSize)
}

type memory struct {
	mu      sync.Mutex
	closed  bool
	rev     int64
	kv      map[string]Entry
	logSize int
	// log holds the events after revision compacted, oldest first.
	log       []Event
	compacted int64
	// changed is closed and replaced on every write, to wake watchers.
	changed   chan struct{}
	nextLease LeaseID
	leases    map[LeaseID]*memLease
	elections map[string][]*memCandidate
}

type memLease struct {
	id    LeaseID
	ttl   time.Duration
	timer *time.Timer
	keys  map[string]struct{}
	done  chan struct{}
}

type memCandidate struct {
	lease LeaseID
	name  string
	value string
	won   chan struct{}
	done  chan struct{}
	gone  bool
}

var _ Store = (*memory)(nil)

func newMemory(logSize int) *memory {
	return &memory{
		kv:        make(map[string]Entry),
		logSize:   logSize,
		changed:   make(chan struct{}),
		leases:    make(map[LeaseID]*memLease),
		elections: make(map[string][]*memCandidate),
	}
}

func (m *memory) Get(ctx context.Context, key string) (Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Entry{}, fmt.Errorf("getting %s: %w", key, ErrClosed)
	}
	e, ok := m.kv[key]
	if !ok {
		return Entry{}, fmt.Errorf("getting %s: %w", key, ErrNotFound)
	}
	return cloneEntry(e), nil
}

func (m *memory) List(ctx context.Context, prefix string) ([]Entry, int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, 0, fmt.Errorf("listing %s: %w", prefix, ErrClosed)
	}
	var out []Entry
	for k, e := range m.kv {
		if strings.HasPrefix(k, prefix) {
			out = append(out, cloneEntry(e))
		}
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out, m.rev, nil
}

func (m *memory) Create(ctx context.Context, key string, value []byte, opts WriteOptions) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.writableLocked(opts); err != nil {
		return 0, fmt.Errorf("creating %s: %w", key, err)
	}
	if _, ok := m.kv[key]; ok {
		return 0, fmt.Errorf("creating %s: %w", key, ErrExists)
	}
	return m.putLocked(key, value, opts.Lease), nil
}

func (m *memory) Update(ctx context.Context, key string, value []byte, rev int64, opts WriteOptions) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.writableLocked(opts); err != nil {
		return 0, fmt.Errorf("updating %s: %w", key, err)
	}
	e, ok := m.kv[key]
	if !ok {
		return 0, fmt.Errorf("updating %s: %w", key, ErrNotFound)
	}
	if e.Revision != rev {
		return 0, fmt.Errorf("updating %s at revision %d (now %d): %w", key, rev, e.Revision, ErrConflict)
	}
	return m.putLocked(key, value, opts.Lease), nil
}

func (m *memory) Put(ctx context.Context, key string, value []byte, opts WriteOptions) (int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.writableLocked(opts); err != nil {
		return 0, fmt.Errorf("putting %s: %w", key, err)
	}
	return m.putLocked(key, value, opts.Lease), nil
}

func (m *memory) Delete(ctx context.Context, key string, rev int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("deleting %s: %w", key, ErrClosed)
	}
	e, ok := m.kv[key]
	if !ok {
		return fmt.Errorf("deleting %s: %w", key, ErrNotFound)
	}
	if rev > 0 && e.Revision != rev {
		return fmt.Errorf("deleting %s at revision %d (now %d): %w", key, rev, e.Revision, ErrConflict)
	}
	m.rev++
	m.deleteLocked(key)
	m.notifyLocked()
	return nil
}

// writableLocked checks what every write needs: an open store and, if
// the write is bound to a lease, a live lease (etcd refuses unknown ones).
func (m *memory) writableLocked(opts WriteOptions) error {
	if m.closed {
		return ErrClosed
	}
	if opts.Lease != 0 {
		if _, ok := m.leases[opts.Lease]; !ok {
			return fmt.Errorf("binding to lease %x: %w", int64(opts.Lease), ErrNotFound)
		}
	}
	return nil
}

func (m *memory) putLocked(key string, value []byte, lease LeaseID) int64 {
	m.rev++
	if old, ok := m.kv[key]; ok && old.Lease != 0 {
		if l := m.leases[old.Lease]; l != nil {
			delete(l.keys, key)
		}
	}
	e := Entry{Key: key, Value: bytes.Clone(value), Revision: m.rev, Lease: lease}
	if e.Value == nil {
		e.Value = []byte{}
	}
	m.kv[key] = e
	if lease != 0 {
		m.leases[lease].keys[key] = struct{}{}
	}
	m.appendLocked(Event{Type: EventPut, Entry: e})
	m.notifyLocked()
	return m.rev
}

// deleteLocked removes key at the current revision; the caller has
// already advanced m.rev, so that a lease's keys all go in one revision.
func (m *memory) deleteLocked(key string) {
	old := m.kv[key]
	if old.Lease != 0 {
		if l := m.leases[old.Lease]; l != nil {
			delete(l.keys, key)
		}
	}
	delete(m.kv, key)
	m.appendLocked(Event{Type: EventDelete, Entry: Entry{Key: key, Revision: m.rev}})
}

func (m *memory) appendLocked(ev Event) {
	m.log = append(m.log, ev)
	if len(m.log) > m.logSize {
		drop := len(m.log) - m.logSize/2
		m.compacted = m.log[drop-1].Entry.Revision
		// Never split one revision's events: a watcher resumes by revision.
		for drop < len(m.log) && m.log[drop].Entry.Revision == m.compacted {
			drop++
		}
		m.log = slices.Clone(m.log[drop:])
	}
}

func (m *memory) notifyLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

func (m *memory) Watch(ctx context.Context, prefix string, afterRev int64) <-chan Event {
	ch := make(chan Event)
	go func() {
		defer close(ch)
		send := func(ev Event) bool {
			select {
			case ch <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		next := afterRev
		for {
			m.mu.Lock()
			if m.closed {
				m.mu.Unlock()
				send(Event{Err: fmt.Errorf("watching %s: %w", prefix, ErrClosed)})
				return
			}
			if next < m.compacted {
				compacted := m.compacted
				m.mu.Unlock()
				send(Event{Err: fmt.Errorf("watching %s after revision %d (compacted to %d): %w", prefix, next, compacted, ErrCompacted)})
				return
			}
			i := sort.Search(len(m.log), func(i int) bool { return m.log[i].Entry.Revision > next })
			var batch []Event
			for _, ev := range m.log[i:] {
				if strings.HasPrefix(ev.Entry.Key, prefix) {
					ev.Entry = cloneEntry(ev.Entry)
					batch = append(batch, ev)
				}
			}
			if m.rev > next {
				next = m.rev
			}
			changed := m.changed
			m.mu.Unlock()
			for _, ev := range batch {
				if !send(ev) {
					return
				}
			}
			select {
			case <-changed:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch
}

func (m *memory) NewSession(ctx context.Context, ttl time.Duration) (Session, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("granting a lease of %s: TTL must be positive", ttl)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("granting a lease: %w", ErrClosed)
	}
	m.nextLease++
	l := &memLease{id: m.nextLease, ttl: ttl, keys: make(map[string]struct{}), done: make(chan struct{})}
	l.timer = time.AfterFunc(ttl, func() { m.revoke(l.id) })
	m.leases[l.id] = l
	m.mu.Unlock()

	kctx, cancel := context.WithCancel(ctx)
	s := &memSession{m: m, lease: l, cancel: cancel}
	go s.keepAlive(kctx)
	return s, nil
}

// revoke ends lease id: its keys go in one revision, its candidates
// withdraw. It reports whether the lease was still there.
func (m *memory) revoke(id LeaseID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.leases[id]
	if !ok || m.closed {
		return false
	}
	l.timer.Stop()
	delete(m.leases, id)
	if len(l.keys) > 0 {
		m.rev++
		keys := make([]string, 0, len(l.keys))
		for k := range l.keys {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			m.deleteLocked(k)
		}
		m.notifyLocked()
	}
	var bound []*memCandidate
	for _, cands := range m.elections {
		for _, c := range cands {
			if c.lease == id {
				bound = append(bound, c)
			}
		}
	}
	for _, c := range bound {
		m.withdrawLocked(c)
	}
	close(l.done)
	return true
}

func (m *memory) refresh(id LeaseID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.leases[id]; ok && !m.closed {
		l.timer.Reset(l.ttl)
	}
}

type memSession struct {
	m      *memory
	lease  *memLease
	cancel context.CancelFunc
}

// keepAlive refreshes the lease three times per TTL, as etcd's client
// does, so one late tick does not lose it.
func (s *memSession) keepAlive(ctx context.Context) {
	t := time.NewTicker(s.lease.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.m.refresh(s.lease.id)
		case <-ctx.Done():
			return
		case <-s.lease.done:
			return
		}
	}
}

func (s *memSession) Lease() LeaseID        { return s.lease.id }
func (s *memSession) Done() <-chan struct{} { return s.lease.done }

func (s *memSession) Close(ctx context.Context) error {
	s.cancel()
	s.m.revoke(s.lease.id)
	return nil
}

func (m *memory) Campaign(ctx context.Context, s Session, name, candidate string) (Leadership, error) {
	ms, ok := s.(*memSession)
	if !ok || ms.m != m {
		return nil, fmt.Errorf("campaigning in %s: session %T is not from this store", name, s)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("campaigning in %s: %w", name, ErrClosed)
	}
	if _, ok := m.leases[ms.lease.id]; !ok {
		m.mu.Unlock()
		return nil, fmt.Errorf("campaigning in %s: session's lease %x: %w", name, int64(ms.lease.id), ErrNotFound)
	}
	c := &memCandidate{lease: ms.lease.id, name: name, value: candidate, won: make(chan struct{}), done: make(chan struct{})}
	m.elections[name] = append(m.elections[name], c)
	if len(m.elections[name]) == 1 {
		close(c.won)
	}
	m.mu.Unlock()

	select {
	case <-c.won:
		return &memLeadership{m: m, c: c}, nil
	case <-c.done:
		return nil, fmt.Errorf("campaigning in %s: session ended", name)
	case <-ctx.Done():
		m.withdraw(c)
		return nil, fmt.Errorf("campaigning in %s: %w", name, ctx.Err())
	}
}

// Evict implements Leases.
func (m *memory) Evict(ctx context.Context, name, candidate string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("evicting %s from %s: %w", candidate, name, ErrClosed)
	}
	for _, c := range slices.Clone(m.elections[name]) {
		if c.value == candidate {
			m.withdrawLocked(c)
		}
	}
	return nil
}

func (m *memory) withdraw(c *memCandidate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.withdrawLocked(c)
}

// withdrawLocked takes c out of its election and, if it led, hands the
// lead to the oldest remaining candidate (FIFO, as etcd's election).
func (m *memory) withdrawLocked(c *memCandidate) {
	if c.gone {
		return
	}
	c.gone = true
	close(c.done)
	cands := m.elections[c.name]
	i := slices.Index(cands, c)
	cands = slices.Delete(cands, i, i+1)
	if len(cands) == 0 {
		delete(m.elections, c.name)
		return
	}
	m.elections[c.name] = cands
	if i == 0 {
		close(cands[0].won)
	}
}

type memLeadership struct {
	m *memory
	c *memCandidate
}

func (l *memLeadership) Done() <-chan struct{} { return l.c.done }

func (l *memLeadership) Resign(ctx context.Context) error {
	l.m.withdraw(l.c)
	return nil
}

func (m *memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	for _, l := range m.leases {
		l.timer.Stop()
		close(l.done)
	}
	for _, cands := range m.elections {
		for _, c := range cands {
			c.gone = true
			close(c.done)
		}
	}
	m.leases, m.elections = nil, nil
	m.notifyLocked()
	return nil
}

func cloneEntry(e Entry) Entry {
	e.Value = bytes.Clone(e.Value)
	return e
}
