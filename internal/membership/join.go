package membership

// JoinPath is the server route node agents learn the cluster's etcd
// endpoints (and data keys) from, with the cluster token.
const JoinPath = "/cluster/join"

// JoinAnswer is what JoinPath returns.
type JoinAnswer struct {
	EtcdEndpoints []string `json:"etcdEndpoints"`
	// DataKey is the cluster's data keys (sealed.ParseKeys' form), for
	// the node's snapshot metadata.
	DataKey string `json:"dataKey,omitempty"`
}
