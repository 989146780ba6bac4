package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// JoinCommand is a new join token and the command that joins a node (or
// an API server, Role "server") with it.
type JoinCommand struct {
	Token     string    `json:"token"`
	ID        string    `json:"id"`
	Role      string    `json:"role"`
	ExpiresAt time.Time `json:"expiresAt"`
	CAHash    string    `json:"caHash"`
	URL       string    `json:"url"`
	Command   string    `json:"command"`
}

// JoinToken is a join token as listed (without its secret).
type JoinToken struct {
	ID          string    `json:"id"`
	Role        string    `json:"role"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"createdAt"`
	ExpiresAt   time.Time `json:"expiresAt"`
}

// CreateJoinToken makes a join token valid for ttl (0: the server's
// default, an hour) and returns the join command (an admin key's call).
func (c *Client) CreateJoinToken(ctx context.Context, ttl time.Duration, description string) (*JoinCommand, error) {
	return c.createJoinToken(ctx, ttl, description, "node")
}

// CreateServerJoinToken makes a join token that joins an API server
// (`aenv server --join`), which is handed the cluster's CA and data key:
// a node's token does not join a server.
func (c *Client) CreateServerJoinToken(ctx context.Context, ttl time.Duration, description string) (*JoinCommand, error) {
	return c.createJoinToken(ctx, ttl, description, "server")
}

func (c *Client) createJoinToken(ctx context.Context, ttl time.Duration, description, role string) (*JoinCommand, error) {
	var out JoinCommand
	body := map[string]any{"ttlSeconds": int(ttl / time.Second), "description": description, "role": role}
	if err := c.do(ctx, http.MethodPost, "/cluster/join-tokens", body, &out); err != nil {
		return nil, fmt.Errorf("creating a join token: %w", err)
	}
	return &out, nil
}

// JoinTokens lists the join tokens not yet expired.
func (c *Client) JoinTokens(ctx context.Context) ([]JoinToken, error) {
	out := []JoinToken{}
	if err := c.do(ctx, http.MethodGet, "/cluster/join-tokens", nil, &out); err != nil {
		return nil, fmt.Errorf("listing join tokens: %w", err)
	}
	return out, nil
}

// RevokeJoinToken revokes join token id: no node joins with it any more.
func (c *Client) RevokeJoinToken(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/cluster/join-tokens/"+url.PathEscape(id), nil, nil); err != nil {
		return fmt.Errorf("revoking join token %s: %w", id, err)
	}
	return nil
}

// RemoveNode removes node id from the cluster: its certificate is
// refused from then on.
func (c *Client) RemoveNode(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/nodes/"+url.PathEscape(id), nil, nil); err != nil {
		return fmt.Errorf("removing node %s: %w", id, err)
	}
	return nil
}

// EtcdMember is a member of the cluster's etcd, as GET /cluster/etcd lists
// them.
type EtcdMember struct {
	// ID is the member's etcd id, in hex.
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	Started    bool     `json:"started"`
	PeerURLs   []string `json:"peerURLs"`
	ClientURLs []string `json:"clientURLs"`
	Learner    bool     `json:"learner"`
	Leader     bool     `json:"leader"`
}

// EtcdMembers lists the members of the cluster's etcd (an admin key's
// call).
func (c *Client) EtcdMembers(ctx context.Context) ([]EtcdMember, error) {
	out := []EtcdMember{}
	if err := c.do(ctx, http.MethodGet, "/cluster/etcd", nil, &out); err != nil {
		return nil, fmt.Errorf("listing etcd members: %w", err)
	}
	return out, nil
}

// RemoveEtcdMember removes the etcd member called name (or of that hex
// id): a server gone for good.
func (c *Client) RemoveEtcdMember(ctx context.Context, name string) error {
	if err := c.do(ctx, http.MethodDelete, "/cluster/etcd/"+url.PathEscape(name), nil, nil); err != nil {
		return fmt.Errorf("removing etcd member %s: %w", name, err)
	}
	return nil
}

// Server is an API server of the cluster, as GET /cluster/servers lists
// them.
type Server struct {
	Name      string   `json:"name"`
	Addresses []string `json:"addresses,omitempty"`
}

// Servers lists the API servers running now (an admin key's call).
func (c *Client) Servers(ctx context.Context) ([]Server, error) {
	out := []Server{}
	if err := c.do(ctx, http.MethodGet, "/cluster/servers", nil, &out); err != nil {
		return nil, fmt.Errorf("listing servers: %w", err)
	}
	return out, nil
}
