package membership

// JoinPath is the server route node agents learn the cluster's etcd
// endpoints (and data keys) from, with the cluster token: the old,
// insecure join over plain HTTP, kept for existing setups.
const JoinPath = "/cluster/join"

// JoinAnswer is what JoinPath, TLSJoinPath and RenewPath return.
type JoinAnswer struct {
	EtcdEndpoints []string `json:"etcdEndpoints"`
	// DataKey is the cluster's data keys (sealed.ParseKeys' form), for
	// the node's snapshot metadata.
	DataKey string `json:"dataKey,omitempty"`
	// Certificate is the node's new certificate and CA the cluster's CA
	// certificate (PEM; TLSJoinPath and RenewPath only).
	Certificate string `json:"certificate,omitempty"`
	CA          string `json:"ca,omitempty"`
}

// TLSJoinPath is the route, on a server's cluster listener (TLS with a
// certificate of the cluster's CA), where a node trades a join token and
// a certificate request for its certificate and a JoinAnswer.
const TLSJoinPath = "/cluster/tls-join"

// RenewPath is the route, on a server's cluster listener, where a node
// presenting its current certificate (mutual TLS) trades a certificate
// request for a new certificate and a JoinAnswer: its renewal, and its
// join at a restart.
const RenewPath = "/cluster/renew"

// JoinRequest is what a node sends to TLSJoinPath (Token and NodeID
// set) and to RenewPath (only CSR: its certificate names it).
type JoinRequest struct {
	// Token is a join token (CreateJoinToken).
	Token  string `json:"token,omitempty"`
	NodeID string `json:"nodeId,omitempty"`
	// Instance is the joining node's (LoadInstance): a join for the id
	// of a live node of another instance is refused.
	Instance string `json:"instance,omitempty"`
	// CSR is a PEM certificate request for the node's key, which never
	// leaves the node.
	CSR string `json:"csr"`
}

// ServerJoinPath is the route, on a server's cluster listener, where an
// API server trades a join token of JoinServer's role for what every
// server of the cluster holds (ServerJoinAnswer): `aenv server --join`.
const ServerJoinPath = "/cluster/server-join"

// ServerJoinRequest is what a server sends to ServerJoinPath.
type ServerJoinRequest struct {
	// Token is a join token of JoinServer's role.
	Token string `json:"token"`
	// EtcdName and EtcdPeerURLs, if set, ask for the joining server to
	// be added to the cluster's etcd as a member of that name, at those
	// peer URLs (ServerJoinAnswer.EtcdInitialCluster).
	EtcdName     string   `json:"etcdName,omitempty"`
	EtcdPeerURLs []string `json:"etcdPeerURLs,omitempty"`
}

// ServerJoinAnswer is what ServerJoinPath returns: the secrets every
// server of the cluster holds, as every server signs certificates and
// seals records. It is sent only over the cluster listener's TLS, which
// the joining server checked against the CA hash it was given; a node's
// join (JoinAnswer) never carries the CA's key.
type ServerJoinAnswer struct {
	EtcdEndpoints []string `json:"etcdEndpoints"`
	// EtcdInitialCluster is the etcd cluster the joining server's member
	// starts in, this member included (when the request asked for one).
	EtcdInitialCluster string `json:"etcdInitialCluster,omitempty"`
	// DataKey is the cluster's data keys (sealed.ParseKeys' form).
	DataKey string `json:"dataKey"`
	// CA and CAKey are the cluster CA's certificate and key (PEM).
	CA    string `json:"ca"`
	CAKey string `json:"caKey"`
	// ClusterToken is the token servers and the nodes that joined the old
	// way authenticate each other with.
	ClusterToken string `json:"clusterToken"`
}
