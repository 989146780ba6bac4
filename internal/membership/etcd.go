package membership

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"github.com/aenvhq/aenv/internal/pki"
	"github.com/aenvhq/aenv/internal/state"
)

// The cluster's etcd, when it serves TLS with certificates of the
// cluster's CA (`aenv server --etcd-listen https://...`, `aenv etcd
// --ca-dir`), has client-certificate auth and RBAC on: etcd takes a
// client's user name from its certificate's CommonName, and users exist
// by exact name.
//
//   - Servers reach it as one user, EtcdServerUser, of etcd's root role:
//     only root may manage users and roles, which servers do at every
//     join and removal of a node. They share one user because a server
//     that comes to the cluster for the first time could create none
//     for itself; as every server holds the CA's key, users of their own
//     would not bound what one can do anyway.
//   - Node n reaches it as NodeUser(n), whose role of the same name holds
//     NodePermissions(n): its own registration and drain mark, and the
//     little it reads. A server grants it when it issues the node's
//     certificate (a join, a renewal) and removes it at `aenv node rm`.
const (
	// EtcdClientName is the server name in the certificate servers
	// reach etcd with.
	EtcdClientName = "etcd-client"
	// EtcdServerUser is the etcd user of servers.
	EtcdServerUser = "server:" + EtcdClientName
)

// NodeUser is node id's etcd user and role: its certificate's
// CommonName.
func NodeUser(id string) string {
	return pki.Identity{Role: pki.RoleNode, Name: id}.CommonName()
}

// NodePermissions are what node id may do in the state: exactly what the
// node agent does there (agent.Start, RegisterNode, MarkStopping,
// ClearStopping, DeregisterNode), so that a node's certificate writes no
// other node's registration and reads no secret:
//
//   - wait for the store (state.HealthKey) and check its data key
//     (DataKeyCheckKey): read;
//   - its live record (under its lease: renewing and revoking the lease
//     need write on it too), its known record and its drain mark:
//     read and write, the key alone;
//   - the cluster's members (MemberPrefixes: the nodes' live and known
//     records, the removals, the servers' records): read, as the node
//     keeps its sandboxes off them (agent's memberWatch lists and
//     watches them) and claimID lists the live records; these hold
//     nothing secret (addresses, capacities, times).
//
// A lease is granted to any authenticated user, and etcd's member list
// read by any.
func NodePermissions(id string) []state.Permission {
	perms := []state.Permission{
		{Key: state.HealthKey},
		{Key: DataKeyCheckKey},
		{Key: LivePrefix + id, Write: true},
		{Key: KnownPrefix + id, Write: true},
		{Key: DrainPrefix + id, Write: true},
	}
	for _, p := range MemberPrefixes {
		perms = append(perms, state.Permission{Key: p, Prefix: true})
	}
	return perms
}

// EtcdUsers manages the users of an etcd with auth on (state.Etcd).
type EtcdUsers interface {
	SetUser(ctx context.Context, user string, perms []state.Permission) error
	RemoveUser(ctx context.Context, user string) error
}

// GrantNode makes node id's etcd user, with NodePermissions.
func GrantNode(ctx context.Context, u EtcdUsers, id string) error {
	if err := u.SetUser(ctx, NodeUser(id), NodePermissions(id)); err != nil {
		return fmt.Errorf("granting node %s its etcd user: %w", id, err)
	}
	return nil
}

// RevokeNode removes node id's etcd user and role: its certificate
// reaches nothing in etcd any more, even before it expires.
func RevokeNode(ctx context.Context, u EtcdUsers, id string) error {
	if err := u.RemoveUser(ctx, NodeUser(id)); err != nil {
		return fmt.Errorf("removing node %s's etcd user: %w", id, err)
	}
	return nil
}

// EtcdMemberFiles are where a member keeps its serving certificate and
// key, etcd-member.{crt,key}, beside the CA's ca.crt in dir.
func EtcdMemberFiles(dir string) pki.Files { return pki.Files{Dir: dir, Name: "etcd-member"} }

// EtcdTLSConfig says what EtcdTLS issues.
type EtcdTLSConfig struct {
	CA *pki.CA
	// Member, if set, is a member's certificate: its files (ca.crt
	// beside them), its name (the certificate's server name is
	// "etcd-member:<name>") and the hosts it serves at (its SANs, for
	// peers and for etcdctl, which check host names).
	Member      *pki.Files
	MemberName  string
	MemberHosts []string
	// Client issues the certificate of EtcdServerUser, for ClientTLS.
	Client bool
	// Lifetime is the certificates' (0: pki.DefaultLifetime).
	Lifetime time.Duration
	Logger   *slog.Logger
}

// EtcdTLS is the certificates of etcd over TLS with the cluster's CA: a
// member's serving certificate in files, which etcd reads again at each
// handshake, and the client certificate of servers, in memory; both
// renewed at two thirds of their life until Close.
type EtcdTLS struct {
	cfg       EtcdTLSConfig
	memberReq pki.Request
	member    *pki.Keypair
	clientReq pki.Request
	client    *pki.Keypair
	cancel    context.CancelFunc
	done      chan struct{}
}

// OpenEtcdTLS issues the certificates cfg asks for and renews them in the
// background.
func OpenEtcdTLS(cfg EtcdTLSConfig) (*EtcdTLS, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := &EtcdTLS{cfg: cfg, done: make(chan struct{})}
	t.memberReq = pki.Request{Identity: pki.Identity{Role: pki.RoleServer, Name: "etcd-member:" + cfg.MemberName},
		Hosts: append([]string{"localhost", "127.0.0.1", "::1"}, cfg.MemberHosts...), Lifetime: cfg.Lifetime}
	t.clientReq = pki.Request{Identity: pki.Identity{Role: pki.RoleServer, Name: EtcdClientName}, Lifetime: cfg.Lifetime}
	now := time.Now()
	if cfg.Member != nil {
		if err := t.issueMember(now); err != nil {
			return nil, err
		}
	}
	if cfg.Client {
		if err := t.issueClient(now); err != nil {
			return nil, err
		}
	}
	bg, cancel := context.WithCancel(context.Background())
	t.cancel = cancel
	go t.renewLoop(bg)
	return t, nil
}

func (t *EtcdTLS) issueMember(now time.Time) error {
	key, err := pki.NewKey()
	if err != nil {
		return err
	}
	certPEM, err := t.cfg.CA.Issue(&key.PublicKey, t.memberReq, now)
	if err != nil {
		return err
	}
	// The key is written before the certificate: a handshake between
	// the two renames fails, and the next one has both.
	if err := t.cfg.Member.Store(certPEM, key, t.cfg.CA.CertPEM()); err != nil {
		return fmt.Errorf("storing the etcd member's certificate: %w", err)
	}
	if t.member == nil {
		t.member, err = pki.NewKeypair(certPEM, key, t.cfg.CA.CertPEM())
		return err
	}
	return t.member.Set(certPEM, key, t.cfg.CA.CertPEM())
}

func (t *EtcdTLS) issueClient(now time.Time) error {
	key, err := pki.NewKey()
	if err != nil {
		return err
	}
	certPEM, err := t.cfg.CA.Issue(&key.PublicKey, t.clientReq, now)
	if err != nil {
		return err
	}
	if t.client == nil {
		t.client, err = pki.NewKeypair(certPEM, key, t.cfg.CA.CertPEM())
		return err
	}
	return t.client.Set(certPEM, key, t.cfg.CA.CertPEM())
}

// renewLoop reissues each certificate at pki.RenewAt, retrying a failure
// every few seconds.
func (t *EtcdTLS) renewLoop(ctx context.Context) {
	defer close(t.done)
	for {
		var next time.Time
		for _, kp := range []*pki.Keypair{t.member, t.client} {
			if kp != nil && (next.IsZero() || pki.RenewAt(kp.Leaf()).Before(next)) {
				next = pki.RenewAt(kp.Leaf())
			}
		}
		if next.IsZero() {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		now := time.Now()
		var err error
		if t.member != nil && !now.Before(pki.RenewAt(t.member.Leaf())) {
			err = t.issueMember(now)
		}
		if t.client != nil && !now.Before(pki.RenewAt(t.client.Leaf())) && err == nil {
			err = t.issueClient(now)
		}
		if err != nil {
			t.cfg.Logger.Error("renewing etcd's certificates", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	}
}

// MemberTLS is the member's TLS for state.Config or state.MemberConfig
// (nil without a member, or a nil t).
func (t *EtcdTLS) MemberTLS() *state.MemberTLS {
	if t == nil || t.cfg.Member == nil {
		return nil
	}
	f := t.cfg.Member
	return &state.MemberTLS{CertFile: f.CertPath(), KeyFile: f.KeyPath(), CAFile: f.CAPath()}
}

// ClientTLS is the TLS servers dial etcd with: EtcdServerUser's
// certificate, to members whose certificate is of the cluster's CA (nil
// without Client, or a nil t).
func (t *EtcdTLS) ClientTLS() *tls.Config {
	if t == nil || t.client == nil {
		return nil
	}
	return EtcdClientTLS(t.client, t.cfg.CA.Verifier())
}

// EtcdClientTLS is the TLS a holder of kp (a server's etcd client
// certificate, a node's own) dials the cluster's etcd with: members
// prove themselves with a server certificate of the CA v trusts. Host
// names are not checked, as on every hop between members (pki.ClientConfig).
func EtcdClientTLS(kp *pki.Keypair, v *pki.Verifier) *tls.Config {
	c := pki.ClientConfig(kp, v, pki.WantRole(pki.RoleServer))
	// gRPC holds its connections for long: nothing to resume.
	c.ClientSessionCache = nil
	return c
}

// Close stops the renewals.
func (t *EtcdTLS) Close() {
	if t == nil {
		return
	}
	t.cancel()
	<-t.done
}
