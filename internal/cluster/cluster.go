// Package cluster is the control plane's model of the sandboxes it runs:
// their records (metadata, owners, deadlines), their placement on nodes and
// the timeouts that end them. The api package drives it; it drives nodes.
// Today the records live in memory and the one node is in-process; the
// node seam is the Node interface, so a remote node slots in behind it.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// Errors the API maps to status codes.
var (
	// ErrNotFound: no such sandbox.
	ErrNotFound = errors.New("sandbox not found")
	// ErrInvalid: the request is malformed or out of range.
	ErrInvalid = errors.New("invalid request")
	// ErrTemplateNotFound: no such template.
	ErrTemplateNotFound = errors.New("template not found")
	// ErrConflict: the sandbox is not in a state that allows the operation.
	ErrConflict = errors.New("conflict")
	// ErrUnsupported: the operation is not available yet.
	ErrUnsupported = errors.New("not supported")
)

// State is a sandbox's lifecycle state as E2B names it.
type State string

// States.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
)

// Node is what the cluster needs of a node. *node.Node implements it
// in-process.
type Node interface {
	ID() string
	Create(ctx context.Context, req node.CreateRequest) (*node.Sandbox, error)
	Kill(ctx context.Context, id string) error
	Usage(ctx context.Context, id string) (node.Usage, error)
	// OnExit registers a handler for sandboxes that died on their own.
	OnExit(fn func(id string))
	Snapshot(ctx context.Context, id string, opts node.SnapshotOptions) (*snapshot.Snapshot, error)
	Snapshots(ctx context.Context, kinds ...snapshot.Kind) ([]*snapshot.Snapshot, error)
	GetSnapshot(ctx context.Context, idOrName string) (*snapshot.Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
}

// Limits bound what a client may ask for.
type Limits struct {
	// MaxTimeout is the longest a sandbox may live without a refresh.
	MaxTimeout time.Duration
	// MaxCPUCount and MaxMemoryMB bound one sandbox's resources.
	MaxCPUCount int
	MaxMemoryMB int
	// MaxMetadata bounds the number of metadata entries and env vars.
	MaxMetadata int
}

// DefaultLimits are the limits used when none are configured.
var DefaultLimits = Limits{MaxTimeout: 24 * time.Hour, MaxCPUCount: 8, MaxMemoryMB: 16384, MaxMetadata: 64}

// Config wires a cluster.
type Config struct {
	Node   Node
	Limits Limits
	// OnGone, if set, is called after a sandbox is killed, paused or died,
	// e.g. to cut the proxy's connections to it.
	OnGone func(id string)
	// StateDir keeps the records of paused sandboxes, so that they survive
	// a restart; empty keeps them in memory only.
	StateDir string
	Logger   *slog.Logger
}

// Sandbox is the control plane's record of a sandbox. Values returned by
// the cluster are copies.
type Sandbox struct {
	ID              string
	TemplateID      string
	Alias           string
	ClientID        string
	NodeID          string
	Metadata        map[string]string
	State           State
	StartedAt       time.Time
	EndAt           time.Time
	CPUCount        int
	MemoryMB        int
	DiskMB          int
	EnvdVersion     string
	EnvdAccessToken string
	AutoPause       bool
	// Addr is where the sandbox's ports are reached from this host.
	Addr netip.Addr
	// SnapshotID holds a paused sandbox's state.
	SnapshotID string
	// AllowInternet is the sandbox's egress setting, kept so that a resumed
	// sandbox or a fork's children get the same.
	AllowInternet bool
}

// CreateRequest describes a sandbox to create.
type CreateRequest struct {
	TemplateID    string
	Timeout       time.Duration
	Metadata      map[string]string
	EnvVars       map[string]string
	AllowInternet bool
	Secure        bool
	AutoPause     bool
	CPUCount      int
	MemoryMB      int
}

type record struct {
	sb    Sandbox
	timer *time.Timer
	// busy is set while a pause, resume or snapshot runs, so that two of
	// them cannot interleave on one sandbox.
	busy bool
}

// Cluster tracks sandboxes. It is safe for concurrent use.
type Cluster struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	records map[string]*record
	closed  bool
}

// New returns a cluster with no sandboxes.
func New(cfg Config) *Cluster {
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, records: make(map[string]*record)}
	cfg.Node.OnExit(c.forget)
	c.loadPaused()
	return c
}

// forget drops the record of a sandbox that no longer exists on its node.
func (c *Cluster) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.records[id]; ok {
		if r.timer != nil {
			r.timer.Stop()
		}
		delete(c.records, id)
		c.log.Warn("sandbox ended on its own", "sandbox_id", id)
	}
	c.gone(id)
}

func (c *Cluster) gone(id string) {
	if c.cfg.OnGone != nil {
		c.cfg.OnGone(id)
	}
}

// Limits returns the cluster's limits.
func (c *Cluster) Limits() Limits { return c.cfg.Limits }

func (c *Cluster) validate(req *CreateRequest) error {
	l := c.cfg.Limits
	switch {
	case req.Timeout <= 0:
		return fmt.Errorf("%w: timeout must be positive", ErrInvalid)
	case req.Timeout > l.MaxTimeout:
		return fmt.Errorf("%w: timeout %s exceeds the maximum of %s", ErrInvalid, req.Timeout, l.MaxTimeout)
	case req.CPUCount < 0 || req.CPUCount > l.MaxCPUCount:
		return fmt.Errorf("%w: cpuCount must be between 1 and %d", ErrInvalid, l.MaxCPUCount)
	case req.MemoryMB < 0 || req.MemoryMB > l.MaxMemoryMB:
		return fmt.Errorf("%w: memoryMB must be between 128 and %d", ErrInvalid, l.MaxMemoryMB)
	case req.MemoryMB > 0 && req.MemoryMB < 128:
		return fmt.Errorf("%w: memoryMB must be at least 128", ErrInvalid)
	case len(req.Metadata) > l.MaxMetadata:
		return fmt.Errorf("%w: at most %d metadata entries", ErrInvalid, l.MaxMetadata)
	case len(req.EnvVars) > 4*l.MaxMetadata:
		return fmt.Errorf("%w: at most %d envVars", ErrInvalid, 4*l.MaxMetadata)
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("%w: invalid env var name %q", ErrInvalid, k)
		}
	}
	return nil
}

// Create validates req, places the sandbox on a node and starts it.
func (c *Cluster) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	if err := c.validate(&req); err != nil {
		return nil, err
	}
	nsb, err := c.cfg.Node.Create(ctx, node.CreateRequest{
		TemplateID: req.TemplateID,
		CPUCount:   req.CPUCount,
		MemoryMB:   req.MemoryMB,
		EnvVars:    req.EnvVars,
		Network:    netns.SlotOptions{AllowInternet: req.AllowInternet},
		Secure:     req.Secure,
	})
	if err != nil {
		if isTemplateNotFound(err) {
			return nil, fmt.Errorf("%w: %q", ErrTemplateNotFound, req.TemplateID)
		}
		return nil, err
	}
	return c.register(ctx, nsb, registration{
		requestedTemplate: req.TemplateID, metadata: req.Metadata, timeout: req.Timeout,
		autoPause: req.AutoPause, allowInternet: req.AllowInternet,
	})
}

// registration is what a new record takes beyond the node's description.
type registration struct {
	requestedTemplate string
	metadata          map[string]string
	timeout           time.Duration
	autoPause         bool
	allowInternet     bool
}

// netipZero is the address of a sandbox that has none (paused).
var netipZero netip.Addr

// register records a sandbox a node started and arms its timeout.
func (c *Cluster) register(ctx context.Context, nsb *node.Sandbox, reg registration) (*Sandbox, error) {
	id := nsb.ID
	r := &record{sb: Sandbox{
		ID:              id,
		TemplateID:      nsb.TemplateID,
		ClientID:        c.cfg.Node.ID(),
		NodeID:          c.cfg.Node.ID(),
		Metadata:        maps.Clone(reg.metadata),
		State:           StateRunning,
		StartedAt:       nsb.StartedAt,
		EndAt:           nsb.StartedAt.Add(reg.timeout),
		CPUCount:        nsb.CPUCount,
		MemoryMB:        nsb.MemoryMB,
		DiskMB:          nsb.DiskMB,
		EnvdVersion:     nsb.EnvdVersion,
		EnvdAccessToken: nsb.EnvdAccessToken,
		AutoPause:       reg.autoPause,
		AllowInternet:   reg.allowInternet,
		Addr:            nsb.Addr,
	}}
	if reg.requestedTemplate != nsb.TemplateID {
		r.sb.Alias = reg.requestedTemplate
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = c.cfg.Node.Kill(context.WithoutCancel(ctx), id)
		return nil, errors.New("creating sandbox: server is shutting down")
	}
	c.records[id] = r
	c.armLocked(r)
	out := r.sb
	out.Metadata = maps.Clone(r.sb.Metadata)
	c.mu.Unlock()
	return &out, nil
}

// armLocked (re)starts r's timeout timer for its EndAt.
func (c *Cluster) armLocked(r *record) {
	if r.timer != nil {
		r.timer.Stop()
	}
	id := r.sb.ID
	r.timer = time.AfterFunc(time.Until(r.sb.EndAt), func() { c.expire(id) })
}

// expire ends a sandbox whose deadline passed (unless it moved meanwhile).
func (c *Cluster) expire(id string) {
	c.mu.Lock()
	r, ok := c.records[id]
	if !ok || time.Now().Before(r.sb.EndAt) || r.sb.State != StateRunning {
		c.mu.Unlock()
		return
	}
	autoPause := r.sb.AutoPause
	c.mu.Unlock()
	if autoPause {
		c.log.Info("sandbox timed out; pausing it", "sandbox_id", id)
		if err := c.Pause(context.Background(), id); err == nil || errors.Is(err, ErrNotFound) {
			return
		} else {
			c.log.Warn("pausing timed-out sandbox failed; killing it", "sandbox_id", id, "err", err)
		}
	}
	c.log.Info("sandbox timed out", "sandbox_id", id)
	if err := c.Kill(context.Background(), id); err != nil && !errors.Is(err, ErrNotFound) {
		c.log.Warn("killing timed-out sandbox", "sandbox_id", id, "err", err)
	}
}

// Get returns a copy of a sandbox's record.
func (c *Cluster) Get(id string) (*Sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.records[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	out := r.sb
	out.Metadata = maps.Clone(r.sb.Metadata)
	return &out, nil
}

// ListFilter selects sandboxes.
type ListFilter struct {
	// Metadata entries must all match.
	Metadata map[string]string
	// States, if not empty, must contain the sandbox's state.
	States []State
}

// List returns the sandboxes matching f, ordered by start time then id.
func (c *Cluster) List(f ListFilter) []*Sandbox {
	c.mu.Lock()
	var out []*Sandbox
	for _, r := range c.records {
		if !f.match(&r.sb) {
			continue
		}
		sb := r.sb
		sb.Metadata = maps.Clone(r.sb.Metadata)
		out = append(out, &sb)
	}
	c.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.Before(out[j].StartedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

func (f ListFilter) match(sb *Sandbox) bool {
	for k, v := range f.Metadata {
		if got, ok := sb.Metadata[k]; !ok || got != v {
			return false
		}
	}
	if len(f.States) == 0 {
		return true
	}
	for _, s := range f.States {
		if s == sb.State {
			return true
		}
	}
	return false
}

// Kill ends a sandbox and forgets it.
func (c *Cluster) Kill(ctx context.Context, id string) error {
	c.mu.Lock()
	r, ok := c.records[id]
	if ok {
		delete(c.records, id)
		if r.timer != nil {
			r.timer.Stop()
		}
	}
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if r.sb.State == StatePaused {
		c.removePausedRecord(id)
		if err := c.cfg.Node.DeleteSnapshot(ctx, r.sb.SnapshotID); err != nil {
			c.log.Warn("deleting paused sandbox's snapshot", "sandbox_id", id, "err", err)
		}
		return nil
	}
	err := c.cfg.Node.Kill(ctx, id)
	c.gone(id)
	return err
}

// SetTimeout moves a sandbox's deadline to now + d.
func (c *Cluster) SetTimeout(id string, d time.Duration) (*Sandbox, error) {
	return c.extend(id, d, false)
}

// Refresh moves a sandbox's deadline to now + d unless it is already later.
func (c *Cluster) Refresh(id string, d time.Duration) (*Sandbox, error) {
	return c.extend(id, d, true)
}

func (c *Cluster) extend(id string, d time.Duration, onlyLater bool) (*Sandbox, error) {
	if d <= 0 || d > c.cfg.Limits.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1s and %s", ErrInvalid, c.cfg.Limits.MaxTimeout)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.records[id]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if r.sb.State != StateRunning {
		return nil, fmt.Errorf("%w: sandbox %s is %s (connect resumes it)", ErrConflict, id, r.sb.State)
	}
	end := time.Now().UTC().Add(d)
	if onlyLater && end.Before(r.sb.EndAt) {
		out := r.sb
		return &out, nil
	}
	r.sb.EndAt = end
	c.armLocked(r)
	out := r.sb
	return &out, nil
}

// Usage reads a sandbox's resource use from its node.
func (c *Cluster) Usage(ctx context.Context, id string) (node.Usage, *Sandbox, error) {
	sb, err := c.Get(id)
	if err != nil {
		return node.Usage{}, nil, err
	}
	if sb.State != StateRunning {
		return node.Usage{Since: time.Now()}, sb, nil // a paused sandbox uses nothing
	}
	u, err := c.cfg.Node.Usage(ctx, id)
	return u, sb, err
}

// Close kills every sandbox; the cluster accepts no creates afterwards.
func (c *Cluster) Close(ctx context.Context) error {
	c.mu.Lock()
	c.closed = true
	ids := make([]string, 0, len(c.records))
	for id, r := range c.records {
		// Paused sandboxes outlive the server: their state is on disk.
		if r.sb.State == StateRunning {
			ids = append(ids, id)
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := c.Kill(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
