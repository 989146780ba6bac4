package state

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Defaults for Config's zero fields.
const (
	DefaultPrefix     = "/aenv/"
	DefaultQuotaBytes = 2 << 30
	DefaultOpTimeout  = 5 * time.Second
)

// listPageSize bounds one range request so that a List of 100,000 records
// is not one huge response (5,000 records of ~500 bytes are ~2.5 MB).
// Pages are not smaller because etcd counts the rest of the range for
// every page: with 1,000 a List of 100,000 records took 1.2 s, with 5,000
// 0.4 s (BenchmarkRecords100k).
const listPageSize = 5000

// Config says which etcd to use and how.
type Config struct {
	// Endpoints of an external etcd cluster; empty runs an embedded member.
	Endpoints []string
	// CAFile, CertFile and KeyFile are TLS for external endpoints (all
	// optional; CAFile alone verifies the server only).
	CAFile, CertFile, KeyFile string
	// ClientTLS, if set, is the TLS the client dials with instead of the
	// files: a certificate of the cluster's CA, renewed in place (its
	// GetClientCertificate is asked at each handshake).
	ClientTLS *tls.Config
	// DataDir holds the embedded member's data (callers pass
	// <data-dir>/etcd).
	DataDir string
	// SocketDir is where the embedded member listens, on the unix socket
	// SocketDir/SocketName only (callers pass <run-dir>), so that nothing
	// on the network can reach the state of a single-host install.
	SocketDir string
	// ClientURLs, if set, replace the embedded member's unix socket with
	// these URLs: https ones (any address) with MemberTLS, http ones on
	// loopback only (e.g. http://127.0.0.1:23790) unless Insecure.
	ClientURLs []string
	// MemberTLS is the embedded member's TLS for https ClientURLs; its
	// clients (this one too: ClientTLS) must present a certificate of its
	// CA.
	MemberTLS *MemberTLS
	// PeerURLs, if set, make the embedded member one of several (servers
	// each running one: a cluster that outlives any one server without
	// an external etcd): it listens for its peers there, with MemberTLS,
	// and advertises them with its ClientURLs, which must then name
	// addresses its peers and the nodes reach. Empty: a member alone,
	// with no peer listener.
	PeerURLs []string
	// MemberName names the embedded member among its peers (default
	// "aenv", the first member's).
	MemberName string
	// InitialCluster is, for a member's first start in a cluster that
	// exists, "name=peerURL,..." of every member, this one included, as
	// AddMember answers. Empty: a new cluster of this member (or a member
	// with data, which holds its cluster's membership).
	InitialCluster string
	// Insecure allows plain http off loopback, to listen on or to dial
	// (--insecure-cluster).
	Insecure bool
	// Prefix namespaces every key (default DefaultPrefix), so several aenv
	// clusters may share one etcd. Keys under Prefix+"elections/" are the
	// elections' own.
	Prefix string
	// QuotaBytes is the embedded member's backend quota (default
	// DefaultQuotaBytes).
	QuotaBytes int64
	// OpTimeout bounds each call so that a dead etcd answers
	// ErrUnavailable fast (default DefaultOpTimeout).
	OpTimeout time.Duration
	// Logger receives etcd's errors and WaitReady's retries (default
	// slog.Default()).
	Logger *slog.Logger
}

// Stats is what etcd reports about its backend.
type Stats struct {
	// Endpoint is the member that answered.
	Endpoint string
	// Version is that member's etcd version.
	Version string
	// DBSize is the backend file's size in bytes; DBSizeInUse the part
	// of it holding live data (the rest is freed by compaction and
	// returned to the disk only by a defragmentation).
	DBSize, DBSizeInUse int64
	// Revision is the store's current revision.
	Revision int64
}

// Etcd is a Store on etcd. It is safe for concurrent use.
type Etcd struct {
	cfg    Config
	log    *slog.Logger
	client *clientv3.Client
	// member is the embedded etcd, or nil for an external cluster.
	member    *embed.Etcd
	endpoints []string
	prefix    string
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ Store = (*Etcd)(nil)

// Open connects to cfg.Endpoints, or starts an embedded member in
// cfg.DataDir and connects to it. It does not wait for an external
// cluster to answer (see WaitReady), so that a server can start while
// etcd is down and report ErrUnavailable until it is back.
func Open(ctx context.Context, cfg Config) (*Etcd, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.QuotaBytes == 0 {
		cfg.QuotaBytes = DefaultQuotaBytes
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	e := &Etcd{cfg: cfg, log: cfg.Logger, prefix: cfg.Prefix, endpoints: cfg.Endpoints}

	tlsCfg := cfg.ClientTLS
	for _, ep := range cfg.Endpoints {
		// https may verify with the system's roots and present nothing.
		if err := CheckURL(ep, true, cfg.Insecure); err != nil {
			return nil, fmt.Errorf("connecting to etcd: %w", err)
		}
	}
	if len(cfg.Endpoints) == 0 {
		if cfg.MemberTLS != nil && tlsCfg == nil {
			return nil, errors.New("starting embedded etcd: a member with TLS needs its client's TLS (ClientTLS)")
		}
		member, endpoints, err := startEmbedded(ctx, cfg)
		if err != nil {
			return nil, err
		}
		e.member, e.endpoints = member, endpoints
	} else if tlsCfg == nil && (cfg.CAFile != "" || cfg.CertFile != "" || cfg.KeyFile != "") {
		info := transport.TLSInfo{TrustedCAFile: cfg.CAFile, CertFile: cfg.CertFile, KeyFile: cfg.KeyFile}
		var err error
		if tlsCfg, err = info.ClientConfig(); err != nil {
			return nil, fmt.Errorf("loading etcd client TLS: %w", err)
		}
	}

	client, err := clientv3.New(clientv3.Config{
		Endpoints:            e.endpoints,
		DialTimeout:          cfg.OpTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: cfg.OpTimeout,
		TLS:                  tlsCfg,
		Logger:               zap.New(newSlogCore(cfg.Logger.With("component", "etcd-client"))),
		// Records are small, but one List page of them is not.
		MaxCallRecvMsgSize: 64 << 20,
	})
	if err != nil {
		if e.member != nil {
			e.member.Close()
		}
		return nil, fmt.Errorf("connecting to etcd at %s: %w", strings.Join(e.endpoints, ","), err)
	}
	e.client = client
	return e, nil
}

// Endpoints are the client URLs this store talks to: the external ones,
// or the embedded member's socket (which other clients may Open too).
func (e *Etcd) Endpoints() []string { return slices.Clone(e.endpoints) }

// HealthKey is the key WaitReady reads (it need not exist): a user that
// may read it may wait for the store.
const HealthKey = "health"

// WaitReady blocks until etcd answers a read, retrying with exponential
// backoff (capped at 10 s) and logging each failure, or until ctx ends.
func (e *Etcd) WaitReady(ctx context.Context) error {
	backoff := 500 * time.Millisecond
	where := strings.Join(e.endpoints, ",")
	for {
		_, err := e.Get(ctx, HealthKey)
		if err == nil || errors.Is(err, ErrNotFound) {
			return nil
		}
		if errors.Is(err, ErrClosed) || errors.Is(err, ErrDenied) {
			return fmt.Errorf("waiting for etcd at %s: %w", where, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for etcd at %s: %w (last error: %w)", where, ctx.Err(), err)
		}
		e.log.Warn(fmt.Sprintf("etcd at %s unavailable: %v; retrying in %s", where, err, backoff),
			"endpoints", where, "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return fmt.Errorf("waiting for etcd at %s: %w (last error: %w)", where, ctx.Err(), err)
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// Backup writes a point-in-time snapshot of the whole etcd keyspace to w,
// for RestoreEmbedded (or etcdutl snapshot restore).
func (e *Etcd) Backup(ctx context.Context, w io.Writer) error {
	if e.closed.Load() {
		return fmt.Errorf("backing up etcd: %w", ErrClosed)
	}
	resp, err := e.client.SnapshotWithVersion(ctx)
	if err != nil {
		return e.wrap("backing up etcd", err)
	}
	defer resp.Snapshot.Close()
	if _, err := io.Copy(w, resp.Snapshot); err != nil {
		return e.wrap("backing up etcd", err)
	}
	return nil
}

// Stats asks the first member that answers for its backend's size and
// the current revision.
func (e *Etcd) Stats(ctx context.Context) (Stats, error) {
	if e.closed.Load() {
		return Stats{}, fmt.Errorf("getting etcd stats: %w", ErrClosed)
	}
	var errs []error
	for _, ep := range e.endpoints {
		cctx, cancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
		st, err := e.client.Status(cctx, ep)
		cancel()
		if err != nil {
			errs = append(errs, e.wrap("getting status of "+ep, err))
			continue
		}
		return Stats{
			Endpoint:    ep,
			Version:     st.Version,
			DBSize:      st.DbSize,
			DBSizeInUse: st.DbSizeInUse,
			Revision:    st.Header.Revision,
		}, nil
	}
	return Stats{}, fmt.Errorf("getting etcd stats: %w", errors.Join(errs...))
}

// MemberURLs are the client and peer URLs of every member of the etcd
// cluster, as it lists them: where the cluster's state lives, which
// sandboxes must never reach.
func (e *Etcd) MemberURLs(ctx context.Context) ([]string, error) {
	if e.closed.Load() {
		return nil, fmt.Errorf("listing etcd members: %w", ErrClosed)
	}
	cctx, cancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
	defer cancel()
	resp, err := e.client.MemberList(cctx)
	if err != nil {
		return nil, e.wrap("listing etcd members", err)
	}
	var out []string
	for _, m := range resp.Members {
		out = append(out, m.ClientURLs...)
		out = append(out, m.PeerURLs...)
	}
	return out, nil
}

// Get implements KV with a linearizable read.
func (e *Etcd) Get(ctx context.Context, key string) (Entry, error) {
	op := "getting " + key
	if e.closed.Load() {
		return Entry{}, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	var resp *clientv3.GetResponse
	err := e.retrying(ctx, func(cctx context.Context) (err error) {
		resp, err = e.client.Get(cctx, e.prefix+key)
		return err
	})
	if err != nil {
		return Entry{}, e.wrap(op, err)
	}
	if len(resp.Kvs) == 0 {
		return Entry{}, fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	return e.entry(resp.Kvs[0].Key, resp.Kvs[0].Value, resp.Kvs[0].ModRevision, resp.Kvs[0].Lease), nil
}

// List reads in pages at one revision, so the result is one consistent
// snapshot however many pages it takes. If compaction overtakes that
// revision between pages, it starts again at a newer one.
func (e *Etcd) List(ctx context.Context, prefix string) ([]Entry, int64, error) {
	op := "listing " + prefix
	if e.closed.Load() {
		return nil, 0, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	var err error
	for range 3 {
		var out []Entry
		var rev int64
		out, rev, err = e.listOnce(ctx, prefix)
		if err == nil {
			return out, rev, nil
		}
		if !errors.Is(err, ErrCompacted) {
			break
		}
	}
	return nil, 0, err
}

func (e *Etcd) listOnce(ctx context.Context, prefix string) ([]Entry, int64, error) {
	op := "listing " + prefix
	from := e.prefix + prefix
	end := clientv3.GetPrefixRangeEnd(from)
	var out []Entry
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPageSize)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		cctx, cancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
		resp, err := e.client.Get(cctx, from, opts...)
		cancel()
		if err != nil {
			return nil, 0, e.wrap(op, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			out = append(out, e.entry(kv.Key, kv.Value, kv.ModRevision, kv.Lease))
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Create implements KV as a transaction on the key's create revision.
func (e *Etcd) Create(ctx context.Context, key string, value []byte, opts WriteOptions) (int64, error) {
	op := "creating " + key
	k := e.prefix + key
	resp, err := e.txn(ctx, op,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k), "=", 0)},
		clientv3.OpPut(k, string(value), leaseOpts(opts)...), value)
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%s: %w", op, ErrExists)
	}
	return resp.Header.Revision, nil
}

// Update implements KV as a transaction on the key's mod revision.
func (e *Etcd) Update(ctx context.Context, key string, value []byte, rev int64, opts WriteOptions) (int64, error) {
	op := "updating " + key
	k := e.prefix + key
	resp, err := e.txn(ctx, op,
		[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", rev)},
		clientv3.OpPut(k, string(value), leaseOpts(opts)...), value)
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, e.conflict(op, rev, resp)
	}
	return resp.Header.Revision, nil
}

// Put implements KV.
func (e *Etcd) Put(ctx context.Context, key string, value []byte, opts WriteOptions) (int64, error) {
	op := "putting " + key
	if e.closed.Load() {
		return 0, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	var resp *clientv3.PutResponse
	err := e.retrying(ctx, func(cctx context.Context) (err error) {
		resp, err = e.client.Put(cctx, e.prefix+key, string(value), leaseOpts(opts)...)
		return err
	})
	if err != nil {
		return 0, e.wrap(op, err)
	}
	return resp.Header.Revision, nil
}

// Delete implements KV; the transaction reads the key back on failure
// to tell ErrConflict from ErrNotFound.
func (e *Etcd) Delete(ctx context.Context, key string, rev int64) error {
	op := "deleting " + key
	k := e.prefix + key
	cmp := clientv3.Compare(clientv3.CreateRevision(k), ">", 0)
	if rev > 0 {
		cmp = clientv3.Compare(clientv3.ModRevision(k), "=", rev)
	}
	resp, err := e.txn(ctx, op, []clientv3.Cmp{cmp}, clientv3.OpDelete(k), nil)
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return e.conflict(op, rev, resp)
	}
	return nil
}

// txn runs then if cmps hold, and otherwise reads the key back so that the
// caller can tell a conflict from a missing key. then writes value (nil:
// deletes the key): when a first attempt timed out and the retry finds the
// key already as then leaves it, the first attempt was applied and the
// transaction succeeded.
func (e *Etcd) txn(ctx context.Context, op string, cmps []clientv3.Cmp, then clientv3.Op, value []byte) (*clientv3.TxnResponse, error) {
	if e.closed.Load() {
		return nil, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	var resp *clientv3.TxnResponse
	attempts := 0
	err := e.retrying(ctx, func(cctx context.Context) (err error) {
		attempts++
		resp, err = e.client.Txn(cctx).If(cmps...).Then(then).Else(clientv3.OpGet(string(then.KeyBytes()))).Commit()
		return err
	})
	if err != nil {
		return nil, e.wrap(op, err)
	}
	if attempts > 1 && !resp.Succeeded && len(resp.Responses) > 0 {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if (value == nil && len(kvs) == 0) || (value != nil && len(kvs) == 1 && bytes.Equal(kvs[0].Value, value)) {
			resp.Succeeded = true
			if len(kvs) == 1 {
				resp.Header.Revision = kvs[0].ModRevision
			}
		}
	}
	return resp, nil
}

// retrying runs call with half of OpTimeout, and once more with the rest
// when the first attempt timed out or found no leader: a request that
// reached a member whose leader just died is lost, and the member waits
// out its own request timeout before it says so, while a second attempt
// reaches the new leader at once. Only the retry of a write can find its
// own first attempt applied; txn deals with that.
func (e *Etcd) retrying(ctx context.Context, call func(context.Context) error) error {
	first := e.cfg.OpTimeout / 2
	cctx, cancel := context.WithTimeout(ctx, first)
	err := call(cctx)
	cancel()
	if err == nil || ctx.Err() != nil || !errors.Is(classify(err), ErrUnavailable) {
		return err
	}
	cctx, cancel = context.WithTimeout(ctx, e.cfg.OpTimeout-first)
	defer cancel()
	return call(cctx)
}

func (e *Etcd) conflict(op string, rev int64, resp *clientv3.TxnResponse) error {
	if len(resp.Responses) == 0 || len(resp.Responses[0].GetResponseRange().Kvs) == 0 {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	now := resp.Responses[0].GetResponseRange().Kvs[0].ModRevision
	return fmt.Errorf("%s at revision %d (now %d): %w", op, rev, now, ErrConflict)
}

func leaseOpts(opts WriteOptions) []clientv3.OpOption {
	if opts.Lease == 0 {
		return nil
	}
	return []clientv3.OpOption{clientv3.WithLease(clientv3.LeaseID(opts.Lease))}
}

func (e *Etcd) entry(key, value []byte, rev, lease int64) Entry {
	if value == nil {
		value = []byte{}
	}
	return Entry{
		Key:      strings.TrimPrefix(string(key), e.prefix),
		Value:    value,
		Revision: rev,
		Lease:    LeaseID(lease),
	}
}

// Watch implements Watcher. It requires a leader, so that a member cut
// off from its cluster ends the watch (ErrUnavailable) instead of going
// silent.
func (e *Etcd) Watch(ctx context.Context, prefix string, afterRev int64) <-chan Event {
	ch := make(chan Event)
	go func() {
		defer close(ch)
		op := fmt.Sprintf("watching %s after revision %d", prefix, afterRev)
		send := func(ev Event) bool {
			select {
			case ch <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		if e.closed.Load() {
			send(Event{Err: fmt.Errorf("%s: %w", op, ErrClosed)})
			return
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		defer cancel()
		wch := e.client.Watch(wctx, e.prefix+prefix, clientv3.WithPrefix(), clientv3.WithRev(afterRev+1))
		for resp := range wch {
			if resp.CompactRevision != 0 {
				send(Event{Err: fmt.Errorf("%s (compacted to %d): %w", op, resp.CompactRevision, ErrCompacted)})
				return
			}
			if err := resp.Err(); err != nil {
				send(Event{Err: e.wrap(op, err)})
				return
			}
			for _, ev := range resp.Events {
				out := Event{Type: EventPut, Entry: e.entry(ev.Kv.Key, ev.Kv.Value, ev.Kv.ModRevision, ev.Kv.Lease)}
				if ev.Type == clientv3.EventTypeDelete {
					out.Type = EventDelete
					out.Entry.Value = nil
				}
				if !send(out) {
					return
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		if e.closed.Load() {
			send(Event{Err: fmt.Errorf("%s: %w", op, ErrClosed)})
			return
		}
		send(Event{Err: fmt.Errorf("%s: watch channel closed: %w", op, ErrUnavailable)})
	}()
	return ch
}

// NewSession grants the lease itself, bounded by OpTimeout, and only then
// hands it to concurrency.Session, whose own Grant would wait on ctx alone.
func (e *Etcd) NewSession(ctx context.Context, ttl time.Duration) (Session, error) {
	// etcd counts TTLs in whole seconds; round up so a lease never lives
	// shorter than asked.
	secs := int64((ttl + time.Second - 1) / time.Second)
	op := fmt.Sprintf("granting a lease of %s", ttl)
	if secs <= 0 {
		return nil, fmt.Errorf("%s: TTL must be positive", op)
	}
	if e.closed.Load() {
		return nil, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	cctx, cancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
	grant, err := e.client.Grant(cctx, secs)
	cancel()
	if err != nil {
		return nil, e.wrap(op, err)
	}
	s, err := concurrency.NewSession(e.client,
		concurrency.WithLease(grant.ID), concurrency.WithTTL(int(secs)), concurrency.WithContext(ctx))
	if err != nil {
		return nil, e.wrap(op, err)
	}
	return &etcdSession{e: e, s: s}, nil
}

type etcdSession struct {
	e *Etcd
	s *concurrency.Session
}

func (s *etcdSession) Lease() LeaseID        { return LeaseID(s.s.Lease()) }
func (s *etcdSession) Done() <-chan struct{} { return s.s.Done() }

// Close revokes with the caller's ctx: concurrency.Session.Close would use
// the session's own ctx, which may already have ended.
func (s *etcdSession) Close(ctx context.Context) error {
	s.s.Orphan()
	op := fmt.Sprintf("revoking lease %x", int64(s.s.Lease()))
	if s.e.closed.Load() {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	cctx, cancel := context.WithTimeout(ctx, s.e.cfg.OpTimeout)
	defer cancel()
	if _, err := s.e.client.Revoke(cctx, s.s.Lease()); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return s.e.wrap(op, err)
	}
	return nil
}

// Campaign implements Leases with concurrency.Election under
// Prefix+"elections/"+name: candidates queue by creation revision (FIFO).
func (e *Etcd) Campaign(ctx context.Context, s Session, name, candidate string) (Leadership, error) {
	op := "campaigning in " + name
	es, ok := s.(*etcdSession)
	if !ok || es.e != e {
		return nil, fmt.Errorf("%s: session %T is not from this store", op, s)
	}
	if e.closed.Load() {
		return nil, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	el := concurrency.NewElection(es.s, e.prefix+"elections/"+name)
	if err := el.Campaign(ctx, candidate); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", op, ctx.Err())
		}
		return nil, e.wrap(op, err)
	}
	l := &etcdLeadership{e: e, el: el, name: name, resigned: make(chan struct{}), done: make(chan struct{})}
	go func() {
		select {
		case <-es.s.Done():
		case <-l.resigned:
		}
		close(l.done)
	}()
	return l, nil
}

// Evict implements Leases: each candidacy is a key under the election's
// prefix holding the candidate's name, bound to its session's lease;
// revoking the lease removes the key and the session.
func (e *Etcd) Evict(ctx context.Context, name, candidate string) error {
	op := "evicting " + candidate + " from " + name
	if e.closed.Load() {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	cctx, cancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
	defer cancel()
	resp, err := e.client.Get(cctx, e.prefix+"elections/"+name+"/", clientv3.WithPrefix())
	if err != nil {
		return e.wrap(op, err)
	}
	for _, kv := range resp.Kvs {
		if string(kv.Value) != candidate || kv.Lease == 0 {
			continue
		}
		if _, err := e.client.Revoke(cctx, clientv3.LeaseID(kv.Lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return e.wrap(op, err)
		}
	}
	return nil
}

type etcdLeadership struct {
	e        *Etcd
	el       *concurrency.Election
	name     string
	once     sync.Once
	resigned chan struct{}
	done     chan struct{}
}

func (l *etcdLeadership) Done() <-chan struct{} { return l.done }

func (l *etcdLeadership) Resign(ctx context.Context) error {
	l.once.Do(func() { close(l.resigned) })
	op := "resigning from " + l.name
	if l.e.closed.Load() {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	cctx, cancel := context.WithTimeout(ctx, l.e.cfg.OpTimeout)
	defer cancel()
	if err := l.el.Resign(cctx); err != nil {
		return l.e.wrap(op, err)
	}
	return nil
}

// Close closes the client and stops the embedded member, waiting for it.
func (e *Etcd) Close() error {
	e.closeOnce.Do(func() {
		e.closed.Store(true)
		var errs []error
		if err := e.client.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("closing etcd client: %w", err))
		}
		if e.member != nil {
			e.member.Close()
		}
		e.closeErr = errors.Join(errs...)
	})
	return e.closeErr
}

// wrap prefixes err with op and adds the class that callers test for,
// keeping etcd's own text visible.
func (e *Etcd) wrap(op string, err error) error {
	if class := classify(err); class != nil {
		return fmt.Errorf("%s: %w: %w", op, class, err)
	}
	if e.closed.Load() {
		return fmt.Errorf("%s: %w: %w", op, ErrClosed, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

func classify(err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return ErrCompacted
	case errors.Is(err, rpctypes.ErrPermissionDenied),
		errors.Is(err, rpctypes.ErrUserEmpty),
		errors.Is(err, rpctypes.ErrUserNotFound),
		errors.Is(err, rpctypes.ErrAuthFailed),
		errors.Is(err, rpctypes.ErrInvalidAuthToken):
		return ErrDenied
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, rpctypes.ErrNoLeader),
		errors.Is(err, rpctypes.ErrNotCapable),
		errors.Is(err, rpctypes.ErrStopped),
		errors.Is(err, rpctypes.ErrTimeout),
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail),
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost),
		errors.Is(err, rpctypes.ErrTimeoutWaitAppliedIndex),
		errors.Is(err, rpctypes.ErrLeaderChanged),
		errors.Is(err, rpctypes.ErrUnhealthy),
		errors.Is(err, rpctypes.ErrNoSpace):
		return ErrUnavailable
	}
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Unavailable, codes.DeadlineExceeded:
			return ErrUnavailable
		}
	}
	return nil
}
