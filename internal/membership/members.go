package membership

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/state"
)

// MemberPrefixes are the prefixes of the state that Members follows.
var MemberPrefixes = []string{LivePrefix, KnownPrefix, RemovedPrefix, ServerPrefix}

// Members is where the cluster's members are, as the registry and etcd
// tell it: the hosts of its nodes, its servers and its etcd members, which
// a node keeps its sandboxes off. A node is a member while it is live,
// and after that while it is known and not removed (`aenv node rm`): one
// whose lease ran out may be back in a moment, at the same address. A
// server is one while its lease lasts. Members is not safe for
// concurrent use; its owner feeds it the events of MemberPrefixes
// (Apply) and etcd's member URLs (SetEtcd).
type Members struct {
	live    map[string]string // node id → host
	known   map[string]knownNode
	removed map[string]time.Time // node id → when
	servers map[string][]string  // server name → hosts
	etcd    []string             // hosts
	// resolved keeps the last answer for each name, so that a resolver
	// that fails for a while does not open a member's address.
	resolved map[string][]netip.Addr
}

type knownNode struct {
	host string
	at   time.Time // when the node last registered
}

// NewMembers returns an empty Members.
func NewMembers() *Members {
	return &Members{live: map[string]string{}, known: map[string]knownNode{}, removed: map[string]time.Time{},
		servers: map[string][]string{}, resolved: map[string][]netip.Addr{}}
}

// Apply takes one change under MemberPrefixes (or an entry of a list of
// them, as a put) and reports whether Hosts may have changed: a node
// reporting its usage, as it does every few seconds, changes none.
func (m *Members) Apply(ev state.Event) bool {
	key, del := ev.Entry.Key, ev.Type == state.EventDelete
	var n NodeInfo
	if id, ok := strings.CutPrefix(key, LivePrefix); ok && !del && json.Unmarshal(ev.Entry.Value, &n) == nil {
		if h, ok := m.live[id]; ok && h == HostOf(n.Address) {
			return false // a report: the node is where it was
		}
	}
	before := m.Hosts()
	switch {
	case strings.HasPrefix(key, LivePrefix):
		id := strings.TrimPrefix(key, LivePrefix)
		if del || json.Unmarshal(ev.Entry.Value, &n) != nil {
			delete(m.live, id)
		} else {
			m.live[id] = HostOf(n.Address)
		}
	case strings.HasPrefix(key, KnownPrefix):
		id := strings.TrimPrefix(key, KnownPrefix)
		if del || json.Unmarshal(ev.Entry.Value, &n) != nil {
			delete(m.known, id)
		} else {
			m.known[id] = knownNode{host: HostOf(n.Address), at: n.UpdatedAt}
		}
	case strings.HasPrefix(key, RemovedPrefix):
		id := strings.TrimPrefix(key, RemovedPrefix)
		at, err := time.Parse(time.RFC3339Nano, string(ev.Entry.Value))
		if del || err != nil {
			delete(m.removed, id)
		} else {
			m.removed[id] = at
		}
	case strings.HasPrefix(key, ServerPrefix):
		name := strings.TrimPrefix(key, ServerPrefix)
		var s ServerInfo
		if del || json.Unmarshal(ev.Entry.Value, &s) != nil {
			delete(m.servers, name)
		} else {
			m.servers[name] = hostsOf(s.Addresses)
		}
	default:
		return false
	}
	return !slices.Equal(before, m.Hosts())
}

// Replace takes the list of one of MemberPrefixes (read again after its
// watch broke) in place of what Members had of it, and reports whether
// Hosts changed.
func (m *Members) Replace(prefix string, entries []state.Entry) bool {
	before := m.Hosts()
	switch prefix {
	case LivePrefix:
		clear(m.live)
	case KnownPrefix:
		clear(m.known)
	case RemovedPrefix:
		clear(m.removed)
	case ServerPrefix:
		clear(m.servers)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Key, prefix) {
			m.Apply(state.Event{Type: state.EventPut, Entry: e})
		}
	}
	return !slices.Equal(before, m.Hosts())
}

// SetEtcd takes the etcd cluster's member URLs (and the endpoints this
// process was given) and reports whether Hosts changed.
func (m *Members) SetEtcd(urls []string) bool {
	hosts := hostsOf(urls)
	if slices.Equal(hosts, m.etcd) {
		return false
	}
	m.etcd = hosts
	return true
}

// Hosts are the members' hosts, names or addresses, sorted, each once.
func (m *Members) Hosts() []string {
	var out []string
	for _, h := range m.live {
		out = append(out, h)
	}
	for id, n := range m.known {
		if at, ok := m.removed[id]; ok && !n.at.After(at) {
			continue // removed since it last registered
		}
		out = append(out, n.host)
	}
	for _, hs := range m.servers {
		out = append(out, hs...)
	}
	out = append(out, m.etcd...)
	out = slices.DeleteFunc(out, func(h string) bool { return h == "" })
	slices.Sort(out)
	return slices.Compact(out)
}

// Addrs are the members' addresses: Hosts, with names resolved by lookup.
// A name that fails to resolve keeps its last answer, and is reported in
// the error beside the addresses.
func (m *Members) Addrs(ctx context.Context, lookup func(ctx context.Context, host string) ([]netip.Addr, error)) ([]netip.Addr, error) {
	var out []netip.Addr
	var errs []error
	hosts := m.Hosts()
	for _, h := range hosts {
		if a, err := netip.ParseAddr(h); err == nil {
			out = append(out, a.Unmap())
			continue
		}
		as, err := lookup(ctx, h)
		if err != nil {
			errs = append(errs, fmt.Errorf("resolving member %s: %w", h, err))
			as = m.resolved[h]
		} else {
			m.resolved[h] = as
		}
		for _, a := range as {
			out = append(out, a.Unmap())
		}
	}
	for h := range m.resolved {
		if _, ok := slices.BinarySearch(hosts, h); !ok {
			delete(m.resolved, h) // no longer a member's
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out), errors.Join(errs...)
}

// HostOf is the host of a member's address: host:port, a URL, or a bare
// host; "" for one with none (a unix socket's URL, an empty address).
func HostOf(addr string) string {
	addr = strings.TrimSpace(addr)
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil || u.Scheme == "unix" || u.Scheme == "unixs" {
			return ""
		}
		return strings.ToLower(u.Hostname())
	}
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return strings.ToLower(h)
	}
	return strings.ToLower(strings.Trim(addr, "[]"))
}

// hostsOf are the hosts of addrs, sorted, each once.
func hostsOf(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		if h := HostOf(a); h != "" {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}
