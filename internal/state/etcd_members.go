package state

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Several servers may each run a member of one embedded etcd cluster, so
// that the cluster's state outlives any one of them without an external
// etcd. The first server's member starts a cluster of itself; a server
// that joins asks a member of it to add it (AddMember) and starts with
// the InitialCluster it answers. It is added as a learner, which takes the
// log without voting until it has caught up, and promotes itself then
// (settleMember): a member that never starts, or takes minutes to catch
// up, never counts against the quorum meanwhile.

// ErrMemberExists: AddMember was asked for a member the cluster has
// under another name or peer URL, or that has started already.
var ErrMemberExists = errors.New("state: etcd member exists")

// ErrNoPeers: AddMember was asked of a cluster whose member listens for
// no peers (a server's embedded member started without PeerURLs).
var ErrNoPeers = errors.New("state: etcd member has no peer listener")

// ErrLastMember: RemoveMember was asked to remove the cluster's only
// member.
var ErrLastMember = errors.New("state: the etcd cluster's only member")

// promoteTimeout bounds a learner's wait to be promoted: it catches up
// on a cluster of our few records in well under a second.
const promoteTimeout = 2 * time.Minute

// Member is one member of the etcd cluster, as it lists them.
type Member struct {
	// ID is the member's etcd id; HexID the same as etcd prints it (and
	// as JSON carries it: no float64 holds every uint64).
	ID    uint64 `json:"-"`
	HexID string `json:"id"`
	Name  string `json:"name"`
	// Started is false for a member added that has not yet started.
	Started    bool     `json:"started"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	// Learner: it takes the log without voting (not yet promoted).
	Learner bool `json:"learner"`
	// Leader is true for the member the cluster's leader is.
	Leader bool `json:"leader"`
}

// peerConfig makes c a member among peers: listening for them at
// cfg.PeerURLs with cfg.MemberTLS, and joining the cluster
// cfg.InitialCluster names if set, else starting one.
func peerConfig(c *embed.Config, cfg Config, clientURLs []string) error {
	tls := cfg.MemberTLS != nil
	for _, s := range cfg.PeerURLs {
		if err := CheckURL(s, tls, cfg.Insecure); err != nil {
			return fmt.Errorf("peer URL: %w", err)
		}
	}
	// Peers and nodes dial what a member advertises.
	for _, s := range append(slices.Clone(clientURLs), cfg.PeerURLs...) {
		u, err := url.Parse(s)
		if err != nil || u.Scheme == "unix" {
			return fmt.Errorf("etcd URL %s: a member with peers serves its clients on the network, at an address they reach: give --etcd-listen too", s)
		}
		if unspecified(u.Hostname()) {
			return fmt.Errorf("etcd URL %s: a member with peers advertises its URLs, so they must name an address others reach, not %s", s, u.Hostname())
		}
	}
	purls, err := parseURLs(cfg.PeerURLs)
	if err != nil {
		return err
	}
	c.ListenPeerUrls, c.AdvertisePeerUrls = purls, purls
	if tls {
		c.PeerTLSInfo = cfg.MemberTLS.info()
	}
	// Peers cross a network: etcd's own election timing, not the short
	// one of a member alone.
	def := embed.NewConfig()
	c.TickMs, c.ElectionMs = def.TickMs, def.ElectionMs
	if cfg.InitialCluster != "" {
		c.InitialCluster = cfg.InitialCluster
		c.ClusterState = embed.ClusterStateFlagExisting
	} else {
		c.InitialCluster = initialCluster(c.Name, cfg.PeerURLs)
	}
	return nil
}

func initialCluster(name string, peerURLs []string) string {
	parts := make([]string, len(peerURLs))
	for i, u := range peerURLs {
		parts[i] = name + "=" + u
	}
	return strings.Join(parts, ",")
}

// settleMember finishes the start of a member among peers, once it
// serves: a learner has itself promoted, and a member whose peer URLs
// changed since it last ran (the first server's, which ran alone and
// advertised none) has the cluster record the new ones. It returns the
// endpoints to reach the cluster with: this member's first, then every
// other's.
func settleMember(ctx context.Context, m *embed.Etcd, cfg Config, own []string) ([]string, error) {
	self := m.Server.MemberID()
	var others []string
	for _, mem := range m.Server.Cluster().Members() {
		if mem.ID != self {
			others = append(others, mem.ClientURLs...)
		}
	}
	if m.Server.IsLearner() {
		if len(others) == 0 {
			return nil, errors.New("this member is a learner, and knows no other member to promote it")
		}
		if err := promote(ctx, cfg, others, uint64(self)); err != nil {
			return nil, err
		}
	}
	if mem := m.Server.Cluster().Member(self); mem != nil && !sameURLs(mem.PeerURLs, cfg.PeerURLs) {
		if err := withClient(ctx, cfg, own, func(cctx context.Context, c *clientv3.Client) error {
			_, err := c.MemberUpdate(cctx, uint64(self), cfg.PeerURLs)
			return err
		}); err != nil {
			return nil, fmt.Errorf("recording this member's peer URLs %s (it had %s): %w", strings.Join(cfg.PeerURLs, ","), strings.Join(mem.PeerURLs, ","), err)
		}
		cfg.Logger.Info("etcd member's peer URLs recorded", "member", m.Config().Name, "peer_urls", strings.Join(cfg.PeerURLs, ","))
	}
	return append(slices.Clone(own), others...), nil
}

// promote has learner id promoted by the members at endpoints (a learner
// serves no such call), retrying while it catches up.
func promote(ctx context.Context, cfg Config, endpoints []string, id uint64) error {
	ctx, cancel := context.WithTimeout(ctx, promoteTimeout)
	defer cancel()
	return withClient(ctx, cfg, endpoints, func(_ context.Context, c *clientv3.Client) error {
		for {
			cctx, ccancel := context.WithTimeout(ctx, DefaultOpTimeout)
			_, err := c.MemberPromote(cctx, id)
			ccancel()
			if err == nil || errors.Is(err, rpctypes.ErrMemberNotLearner) {
				cfg.Logger.Info("etcd member promoted from learner", "member_id", fmt.Sprintf("%x", id))
				return nil
			}
			if !errors.Is(err, rpctypes.ErrMemberLearnerNotReady) && !errors.Is(classify(err), ErrUnavailable) && ctx.Err() == nil {
				return fmt.Errorf("promoting this member from learner: %w", err)
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("promoting this member from learner: not in sync after %s (last: %w)", promoteTimeout, err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
}

// withClient runs f with a client of cfg's TLS at endpoints, closed after.
func withClient(ctx context.Context, cfg Config, endpoints []string, f func(context.Context, *clientv3.Client) error) error {
	c, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: DefaultOpTimeout, TLS: cfg.ClientTLS,
		Logger: zap.New(newSlogCore(cfg.Logger.With("component", "etcd-client"))),
	})
	if err != nil {
		return fmt.Errorf("connecting to etcd at %s: %w", strings.Join(endpoints, ","), err)
	}
	defer c.Close()
	cctx, cancel := context.WithTimeout(ctx, DefaultOpTimeout)
	defer cancel()
	return f(cctx, c)
}

func sameURLs(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// Members lists the etcd cluster's members, with its leader.
func (e *Etcd) Members(ctx context.Context) ([]Member, error) {
	const op = "listing etcd members"
	if e.closed.Load() {
		return nil, fmt.Errorf("%s: %w", op, ErrClosed)
	}
	cctx, cancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
	defer cancel()
	resp, err := e.client.MemberList(cctx)
	if err != nil {
		return nil, e.wrap(op, err)
	}
	var leader uint64
	for _, ep := range e.endpoints {
		if st, err := e.client.Status(cctx, ep); err == nil {
			leader = st.Leader
			break
		}
	}
	out := make([]Member, 0, len(resp.Members))
	for _, m := range resp.Members {
		out = append(out, Member{ID: m.ID, HexID: fmt.Sprintf("%x", m.ID), Name: m.Name, Started: m.Name != "", PeerURLs: m.PeerURLs,
			ClientURLs: m.ClientURLs, Learner: m.IsLearner, Leader: m.ID == leader && leader != 0})
	}
	return out, nil
}

// AddMember adds a member called name, at peerURLs, to the cluster as a
// learner, and returns the InitialCluster it is to start with. Asked
// again for a member added that never started (a join that failed after
// this), it answers the same; a name or a peer URL the cluster has
// otherwise is ErrMemberExists.
func (e *Etcd) AddMember(ctx context.Context, name string, peerURLs []string) (string, error) {
	op := fmt.Sprintf("adding etcd member %s at %s", name, strings.Join(peerURLs, ","))
	if name == "" || len(peerURLs) == 0 {
		return "", fmt.Errorf("%s: a member needs a name and peer URLs", op)
	}
	if _, err := parseURLs(peerURLs); err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	members, err := e.Members(ctx)
	if err != nil {
		return "", fmt.Errorf("%s: %w", op, err)
	}
	var added *Member
	for i, m := range members {
		if slices.ContainsFunc(m.PeerURLs, func(u string) bool { return strings.HasPrefix(u, "unix:") }) {
			return "", fmt.Errorf("%s: %w: member %q listens for no peers; start its server with --etcd-peer-listen https://ADDR:PORT first", op, ErrNoPeers, m.Name)
		}
		overlap := slices.ContainsFunc(m.PeerURLs, func(u string) bool { return slices.Contains(peerURLs, u) })
		switch {
		case overlap && !m.Started && sameURLs(m.PeerURLs, peerURLs):
			added = &members[i]
		case overlap:
			return "", fmt.Errorf("%s: %w: member %q (%x) has peer URLs %s; remove it first ('aenv cluster etcd remove %s') if it is gone for good", op, ErrMemberExists, m.Name, m.ID, strings.Join(m.PeerURLs, ","), m.Name)
		case m.Name == name:
			return "", fmt.Errorf("%s: %w: a member of that name is at %s; give this one another name", op, ErrMemberExists, strings.Join(m.PeerURLs, ","))
		case !m.Started:
			// etcd starts a member only with every other one named, and
			// this one has no name until it starts.
			return "", fmt.Errorf("%s: %w: member %x, added at %s, has not started yet: start it, or remove it ('aenv cluster etcd remove %x')", op, ErrMemberExists, m.ID, strings.Join(m.PeerURLs, ","), m.ID)
		}
	}
	if added == nil {
		resp, err := e.addLearner(ctx, peerURLs)
		if err != nil {
			return "", e.wrap(op, err)
		}
		members = members[:0]
		for _, m := range resp.Members {
			members = append(members, Member{ID: m.ID, Name: m.Name, Started: m.Name != "", PeerURLs: m.PeerURLs})
		}
		added = &Member{ID: resp.Member.ID}
		e.log.Info("etcd member added as a learner", "member", name, "member_id", fmt.Sprintf("%x", resp.Member.ID), "peer_urls", strings.Join(peerURLs, ","))
	}
	var parts []string
	for _, m := range members {
		n := m.Name
		if m.ID == added.ID {
			n = name
		}
		parts = append(parts, initialCluster(n, m.PeerURLs))
	}
	return strings.Join(parts, ","), nil
}

// addLearner adds a learner at peerURLs, waiting out etcd's refusal
// while the voters are settling (see whileSettling).
func (e *Etcd) addLearner(ctx context.Context, peerURLs []string) (*clientv3.MemberAddResponse, error) {
	var resp *clientv3.MemberAddResponse
	err := e.whileSettling(ctx, func(cctx context.Context) (err error) {
		resp, err = e.client.MemberAddAsLearner(cctx, peerURLs)
		return err
	})
	return resp, err
}

// whileSettling runs a membership change until etcd stops refusing it as
// unhealthy, for at most a minute. etcd refuses to change its membership
// until enough voters have been connected to the leader for a few seconds
// (it would not risk the quorum on a member just promoted or restarted),
// so a member added right after another, or removed right after one
// restarted, waits for that instead of failing.
func (e *Etcd) whileSettling(ctx context.Context, change func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, e.cfg.OpTimeout)
		err := change(cctx)
		ccancel()
		if !errors.Is(err, rpctypes.ErrUnhealthy) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// RemoveMember removes the member called name from the cluster: a server
// gone for good, whose vote the quorum would otherwise still count.
func (e *Etcd) RemoveMember(ctx context.Context, name string) error {
	op := "removing etcd member " + name
	members, err := e.Members(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	i := slices.IndexFunc(members, func(m Member) bool { return m.Name == name || m.HexID == name })
	if i < 0 {
		return fmt.Errorf("%s: %w", op, ErrNotFound)
	}
	if len(members) == 1 {
		return fmt.Errorf("%s: %w", op, ErrLastMember)
	}
	err = e.whileSettling(ctx, func(cctx context.Context) error {
		_, err := e.client.MemberRemove(cctx, members[i].ID)
		return err
	})
	if err != nil {
		return e.wrap(op, err)
	}
	e.log.Info("etcd member removed", "member", name, "member_id", fmt.Sprintf("%x", members[i].ID))
	return nil
}
