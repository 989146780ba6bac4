package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/state"
)

// ClusterState is the live state a host keeps its sandboxes off the
// cluster's members by: the registry of nodes and servers, and etcd's
// own list of members (state.Etcd is one).
type ClusterState interface {
	state.KV
	state.Watcher
	// MemberURLs are the client and peer URLs of every etcd member.
	MemberURLs(ctx context.Context) ([]string, error)
}

// memberRefresh is how often etcd's members are read again and the
// members' names resolved again; the registry itself is followed as it
// changes.
const memberRefresh = 30 * time.Second

// memberWatch follows where the cluster's members are (membership.
// Members) and hands their addresses to the host's network, which keeps
// every sandbox off them.
type memberWatch struct {
	st        ClusterState
	endpoints []string // the etcd endpoints this process was given
	log       *slog.Logger
	lookup    func(ctx context.Context, host string) ([]netip.Addr, error)

	mu      sync.Mutex
	members *membership.Members
	revs    map[string]int64 // prefix → revision its list was read at
	kick    chan struct{}
	wg      sync.WaitGroup
}

// openMemberWatch reads the registry and etcd's members, and returns the
// watch with the members' addresses as they are now, for the sandboxes'
// rules to hold from the start.
func openMemberWatch(ctx context.Context, st ClusterState, endpoints []string, log *slog.Logger) (*memberWatch, []netip.Addr, error) {
	w := &memberWatch{st: st, endpoints: endpoints, log: log, members: membership.NewMembers(),
		revs: map[string]int64{}, kick: make(chan struct{}, 1),
		lookup: func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}}
	for _, p := range membership.MemberPrefixes {
		rev, err := w.load(ctx, p)
		if err != nil {
			return nil, nil, err
		}
		w.revs[p] = rev
	}
	w.refreshEtcd(ctx)
	return w, w.addrs(ctx), nil
}

// load reads prefix whole into the members.
func (w *memberWatch) load(ctx context.Context, prefix string) (int64, error) {
	ents, rev, err := w.st.List(ctx, prefix)
	if err != nil {
		return 0, fmt.Errorf("reading the cluster's members (%s): %w", prefix, err)
	}
	w.mu.Lock()
	changed := w.members.Replace(prefix, ents)
	w.mu.Unlock()
	if changed {
		w.poke()
	}
	return rev, nil
}

// refreshEtcd reads etcd's members again; a failure keeps the last list.
func (w *memberWatch) refreshEtcd(ctx context.Context) {
	urls, err := w.st.MemberURLs(ctx)
	if err != nil {
		w.log.Warn("listing etcd's members, which sandboxes are kept off; keeping the last list", "err", err)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.members.SetEtcd(append(urls, w.endpoints...))
}

// addrs are the members' addresses now.
func (w *memberWatch) addrs(ctx context.Context) []netip.Addr {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	as, err := w.members.Addrs(ctx, w.lookup)
	if err != nil {
		w.log.Warn("resolving the cluster's members, which sandboxes are kept off; their last addresses stay blocked", "err", err)
	}
	return as
}

func (w *memberWatch) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run follows the members until ctx ends, calling set with their
// addresses whenever these change; from is what set was given last. wait
// waits for it to end.
func (w *memberWatch) run(ctx context.Context, from []netip.Addr, set func([]netip.Addr) error) {
	for _, p := range membership.MemberPrefixes {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			state.Follow(ctx, w.st, p, w.revs[p],
				func(ctx context.Context) (int64, error) { return w.load(ctx, p) },
				func(ev state.Event) {
					w.mu.Lock()
					changed := w.members.Apply(ev)
					w.mu.Unlock()
					if changed {
						w.poke()
					}
				},
				func(err error) { w.log.Warn("following the cluster's members", "prefix", p, "err", err) })
		}()
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		last := from
		tick := time.NewTicker(memberRefresh)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				w.refreshEtcd(ctx)
			case <-w.kick:
			}
			now := w.addrs(ctx)
			if slices.Equal(now, last) || ctx.Err() != nil {
				continue
			}
			if err := set(now); err != nil {
				w.log.Error("keeping sandboxes off the cluster's members", "err", err)
				continue
			}
			last = now
			w.log.Info("sandboxes are kept off the cluster's members", "addrs", now)
		}
	}()
}

// wait waits for run's goroutines to end (after its ctx did).
func (w *memberWatch) wait() { w.wg.Wait() }
