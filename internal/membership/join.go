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
