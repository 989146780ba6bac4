package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Node is the server's description of a node.
type Node struct {
	ID        string    `json:"id"`
	Address   string    `json:"address,omitempty"`
	State     string    `json:"state"`
	Capacity  NodeUsage `json:"capacity"`
	Usage     NodeUsage `json:"usage"`
	Sandboxes int       `json:"sandboxes"`
	// Pooled counts the sandboxes its warm pool holds prestarted, Pool
	// each template's (or snapshot's) share.
	Pooled         int         `json:"pooled"`
	Pool           []PoolEntry `json:"pool,omitempty"`
	Runtime        string      `json:"runtime"`
	RuntimeVersion string      `json:"runtimeVersion,omitempty"`
	Version        string      `json:"version,omitempty"`
	// ImageCache is its block image cache (nil: it serves no block
	// images, or its last report lacked the figures).
	ImageCache *ImageCache `json:"imageCache,omitempty"`
	// MemoryOvercommit and MemoryHighWater are its admission rule: the
	// multiple of Capacity.MemoryMB its sandboxes may be configured with
	// together, and the fraction of HostMemoryMB in real use past which it
	// takes no more.
	MemoryOvercommit float64   `json:"memoryOvercommit,omitempty"`
	MemoryHighWater  float64   `json:"memoryHighWater,omitempty"`
	HostMemoryMB     int       `json:"hostMemoryMB,omitempty"`
	UpdatedAt        time.Time `json:"updatedAt"`
}

// ImageCache is a node's cache of block image chunks: what it holds of
// its bound, and its reads since its image server started.
type ImageCache struct {
	Bytes     int64 `json:"bytes"`
	MaxBytes  int64 `json:"maxBytes"`
	Hits      int64 `json:"hits"`
	Misses    int64 `json:"misses"`
	Evictions int64 `json:"evictions"`
	// Mounted counts the images mounted on the node.
	Mounted int `json:"mounted"`
}

// PoolEntry is a node's warm pool of one template or snapshot.
type PoolEntry struct {
	TemplateID string `json:"templateID,omitempty"`
	SnapshotID string `json:"snapshotID,omitempty"`
	// Ready is how many it holds prestarted, Target how many it is sized
	// to from recent demand.
	Ready  int `json:"ready"`
	Target int `json:"target"`
	// Prepared: the template's prepared sandboxes, which restores load
	// their state into, not sandboxes a create takes.
	Prepared bool `json:"prepared,omitempty"`
}

// NodeUsage is an amount of a node's resources (in usage, CPUCount is
// the vCPUs its sandboxes are configured with).
type NodeUsage struct {
	CPUCount          int `json:"cpuCount"`
	MemoryMB          int `json:"memoryMB"`
	CommittedMemoryMB int `json:"committedMemoryMB,omitempty"`
	DiskMB            int `json:"diskMB,omitempty"`
}

// Nodes lists the cluster's nodes.
func (c *Client) Nodes(ctx context.Context) ([]Node, error) {
	out := []Node{}
	if err := c.do(ctx, http.MethodGet, "/nodes", nil, &out); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	return out, nil
}

// Drain makes node id take no new sandboxes (or, with drain false, take
// them again).
func (c *Client) Drain(ctx context.Context, id string, drain bool) (*Node, error) {
	method := http.MethodPost
	if !drain {
		method = http.MethodDelete
	}
	var out Node
	if err := c.do(ctx, method, "/nodes/"+url.PathEscape(id)+"/drain", nil, &out); err != nil {
		return nil, fmt.Errorf("draining node %s: %w", id, err)
	}
	return &out, nil
}

// Migration is the outcome of Migrate.
type Migration struct {
	Sandbox
	FromNodeID string `json:"fromNodeID"`
	DowntimeMs int64  `json:"downtimeMs"`
}

// Migrate moves a running sandbox to another node (nodeID, or the one the
// server picks), keeping its id, processes and files.
func (c *Client) Migrate(ctx context.Context, id, nodeID string) (*Migration, error) {
	var out Migration
	body := map[string]string{}
	if nodeID != "" {
		body["nodeID"] = nodeID
	}
	if err := c.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/migrate", body, &out); err != nil {
		return nil, fmt.Errorf("migrating sandbox %s: %w", id, err)
	}
	return &out, nil
}
