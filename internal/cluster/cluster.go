// Package cluster is the control plane's model of the sandboxes it runs:
// their records (metadata, owners, deadlines), their placement on nodes and
// the timeouts that end them. The api package drives it; it drives nodes.
// The records live in the state store (etcd), never only in this process:
// a restarted server finds every sandbox where it left it, and the
// deadlines are enforced by whichever server wins the election. The node
// seam is the Node interface; today the one node is in-process.
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
	"github.com/aenvhq/aenv/internal/state"
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
	// ErrUnavailable: the state store cannot be reached; try again later.
	ErrUnavailable = state.ErrUnavailable
	// ErrNoCapacity: no node can take the sandbox now; try again later.
	ErrNoCapacity = errors.New("no capacity")
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
	// OnExit registers a handler for sandboxes that died on their own,
	// told why.
	OnExit(fn func(id, reason string))
	// List returns the sandboxes the node runs (after a restart, those it
	// recovered), for reconciling with the records.
	List() []*node.Sandbox
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
	// State holds the records; required.
	State state.Store
	// OnGone, if set, is called after a sandbox is killed, paused or died,
	// e.g. to cut the proxy's connections to it.
	OnGone func(id string)
	// LegacyStateDir is where servers before the state store kept the
	// records of paused sandboxes (<dir>/paused/*.json); Open moves them
	// into the store once.
	LegacyStateDir string
	// Candidate names this server in the deadline election; it must be
	// unique to one server at a time (a restarted server evicts its dead
	// predecessor by it). Empty means the node's id.
	Candidate string
	// TickInterval is how often the elected server looks for deadlines
	// that passed; 0 means 250ms.
	TickInterval time.Duration
	Logger       *slog.Logger
}

// Sandbox is the control plane's record of a sandbox. Values returned by
// the cluster are copies.
type Sandbox struct {
	ID              string            `json:"id"`
	TemplateID      string            `json:"templateID"`
	Alias           string            `json:"alias,omitempty"`
	ClientID        string            `json:"clientID"`
	NodeID          string            `json:"nodeID"`
	Metadata        map[string]string `json:"metadata,omitempty"`
	State           State             `json:"state"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskMB          int               `json:"diskMB"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	AutoPause       bool              `json:"autoPause,omitempty"`
	// Addr is where the sandbox's ports are reached from its node.
	Addr netip.Addr `json:"addr,omitzero"`
	// SnapshotID holds a paused sandbox's state.
	SnapshotID string `json:"snapshotID,omitempty"`
	// AllowInternet is the sandbox's egress setting, kept so that a resumed
	// sandbox or a fork's children get the same.
	AllowInternet bool `json:"allowInternet,omitempty"`
}

// CreateRequest describes a sandbox to create. EnvVars are handed to the
// sandbox and never stored: they are the user's secrets.
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

// Cluster tracks sandboxes. It is safe for concurrent use.
type Cluster struct {
	cfg  Config
	log  *slog.Logger
	recs *records

	mu     sync.Mutex
	closed bool
	// expiring holds the ids whose timeout this server is handling.
	expiring map[string]bool

	stop context.CancelFunc
	bg   sync.WaitGroup
}

// Open loads the records from the state store, moves legacy paused
// records into it, reconciles the records with the sandboxes the node
// runs (see reconcile) and starts following the store and campaigning to
// enforce deadlines. Close stops that.
func Open(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.State == nil || cfg.Node == nil {
		return nil, errors.New("opening cluster: a state store and a node are required")
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.TickInterval == 0 {
		cfg.TickInterval = 250 * time.Millisecond
	}
	if cfg.Candidate == "" {
		cfg.Candidate = cfg.Node.ID()
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, recs: newRecords(cfg.State), expiring: map[string]bool{}}
	if err := c.migrateLegacy(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	rev, err := c.recs.load(ctx)
	if err != nil {
		return nil, err
	}
	c.log.Info("sandbox records loaded", "records", len(c.recs.m), "took_ms", time.Since(start).Milliseconds())
	if err := c.reconcile(ctx); err != nil {
		return nil, err
	}
	cfg.Node.OnExit(c.forget)
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	c.bg.Add(2)
	go func() {
		defer c.bg.Done()
		c.recs.follow(bg, rev, func(err error) { c.log.Warn("following sandbox records", "err", err) })
	}()
	go func() {
		defer c.bg.Done()
		c.campaign(bg)
	}()
	return c, nil
}

// forget drops the record of a sandbox that died on its own on its node,
// leaving the reason for whoever asks for it.
func (c *Cluster) forget(id, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, ok := c.recs.get(id); ok {
		if err := c.recs.remove(ctx, id, reason); err != nil {
			c.log.Error("removing record of exited sandbox", "sandbox_id", id, "err", err)
		}
		c.log.Warn("sandbox ended on its own", "sandbox_id", id, "reason", reason)
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
	envBytes := 0
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || len(k) > maxEnvNameBytes {
			return fmt.Errorf("%w: invalid env var name %q (no '=' or NUL, at most %d bytes)", ErrInvalid, truncate(k), maxEnvNameBytes)
		}
		if len(v) > maxEnvValueBytes || strings.ContainsRune(v, 0) {
			return fmt.Errorf("%w: envVars[%q] is %d bytes; values are at most %d bytes, without NUL", ErrInvalid, k, len(v), maxEnvValueBytes)
		}
		envBytes += len(k) + len(v)
	}
	if envBytes > maxEnvTotalBytes {
		return fmt.Errorf("%w: envVars take %d bytes; at most %d in all", ErrInvalid, envBytes, maxEnvTotalBytes)
	}
	metaBytes := 0
	for k, v := range req.Metadata {
		if k == "" || len(k) > maxMetadataKeyBytes {
			return fmt.Errorf("%w: metadata key %q must be 1 to %d bytes", ErrInvalid, truncate(k), maxMetadataKeyBytes)
		}
		if len(v) > maxMetadataValueBytes {
			return fmt.Errorf("%w: metadata[%q] is %d bytes; values are at most %d bytes", ErrInvalid, k, len(v), maxMetadataValueBytes)
		}
		metaBytes += len(k) + len(v)
	}
	if metaBytes > maxMetadataTotalBytes {
		return fmt.Errorf("%w: metadata takes %d bytes; at most %d in all", ErrInvalid, metaBytes, maxMetadataTotalBytes)
	}
	return nil
}

// Size limits of what a create may carry. Every process of the sandbox
// gets the env vars (Linux refuses a single string over 128 KiB in an
// exec), and every list and record carries the metadata.
const (
	maxEnvNameBytes       = 256
	maxEnvValueBytes      = 32 << 10
	maxEnvTotalBytes      = 64 << 10
	maxMetadataKeyBytes   = 128
	maxMetadataValueBytes = 1 << 10
	maxMetadataTotalBytes = 16 << 10
)

// truncate shortens s for an error message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Create validates req, places the sandbox on a node and starts it.
func (c *Cluster) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	if err := c.validate(&req); err != nil {
		return nil, err
	}
	if err := c.admitting(ctx); err != nil {
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
		return nil, classifyNodeError(err)
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

// register stores the record of a sandbox a node started. If the record
// cannot be stored the sandbox is killed: a sandbox nobody can find must
// not run.
func (c *Cluster) register(ctx context.Context, nsb *node.Sandbox, reg registration) (*Sandbox, error) {
	id := nsb.ID
	r := record{Sandbox: Sandbox{
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
		r.Alias = reg.requestedTemplate
	}
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	var err error
	if closed {
		err = errors.New("server is shutting down")
	} else {
		err = c.recs.create(ctx, r)
	}
	if err != nil {
		if kerr := c.cfg.Node.Kill(context.WithoutCancel(ctx), id); kerr != nil {
			c.log.Error("killing unrecorded sandbox", "sandbox_id", id, "err", kerr)
		}
		return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	out := r.Sandbox
	return &out, nil
}

// Get returns a copy of a sandbox's record. For an id that is gone for a
// known reason (lost, died) in the last 24 h the ErrNotFound says why.
func (c *Cluster) Get(ctx context.Context, id string) (*Sandbox, error) {
	r, _, ok := c.recs.get(id)
	if !ok {
		var err error
		if r, _, err = c.recs.fetch(ctx, id); err != nil {
			if errors.Is(err, state.ErrNotFound) {
				return nil, c.notFound(ctx, id)
			}
			return nil, fmt.Errorf("looking up sandbox %s: %w", id, err)
		}
	}
	out := r.Sandbox
	return &out, nil
}

// Addr is where sandbox id's ports are reached. The proxy asks it on
// every request, so it reads the cache without copying the record.
func (c *Cluster) Addr(ctx context.Context, id string) (netip.Addr, error) {
	if a, ok := c.recs.addr(id); ok {
		return a, nil
	}
	sb, err := c.Get(ctx, id)
	if err != nil {
		return netip.Addr{}, err
	}
	return sb.Addr, nil
}

// notFound is the ErrNotFound for id, with the reason it is gone if known.
func (c *Cluster) notFound(ctx context.Context, id string) error {
	if why := c.recs.whyGone(ctx, id); why != "" {
		return fmt.Errorf("%w: %s: %s", ErrNotFound, id, why)
	}
	return fmt.Errorf("%w: %s", ErrNotFound, id)
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
	var out []*Sandbox
	for _, r := range c.recs.matching(func(r *record) bool { return f.match(&r.Sandbox) }) {
		sb := r.Sandbox
		out = append(out, &sb)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.Before(out[j].StartedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Count is how many sandboxes match f (List's length, without copies).
func (c *Cluster) Count(f ListFilter) int {
	n := 0
	c.recs.each(func(r *record) {
		if f.match(&r.Sandbox) {
			n++
		}
	})
	return n
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

// Kill ends a sandbox and forgets it. The record goes first: once Kill
// has begun no other server can pause or resume the sandbox.
func (c *Cluster) Kill(ctx context.Context, id string) error {
	sb, err := c.Get(ctx, id)
	if err != nil {
		return err
	}
	if err := c.recs.remove(ctx, id, ""); err != nil {
		return err
	}
	if sb.State == StatePaused {
		if err := c.cfg.Node.DeleteSnapshot(ctx, sb.SnapshotID); err != nil {
			c.log.Warn("deleting paused sandbox's snapshot", "sandbox_id", id, "err", err)
		}
		return nil
	}
	err = c.cfg.Node.Kill(ctx, id)
	c.gone(id)
	if errors.Is(err, node.ErrNotFound) {
		return nil // it died meanwhile; the record is gone either way
	}
	return err
}

// SetTimeout moves a sandbox's deadline to now + d.
func (c *Cluster) SetTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	return c.extend(ctx, id, d, false)
}

// Refresh moves a sandbox's deadline to now + d unless it is already later.
func (c *Cluster) Refresh(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	return c.extend(ctx, id, d, true)
}

func (c *Cluster) extend(ctx context.Context, id string, d time.Duration, onlyLater bool) (*Sandbox, error) {
	if d <= 0 || d > c.cfg.Limits.MaxTimeout {
		return nil, fmt.Errorf("%w: timeout must be between 1s and %s", ErrInvalid, c.cfg.Limits.MaxTimeout)
	}
	r, err := c.recs.mutate(ctx, id, func(r *record) error {
		if r.State != StateRunning {
			return fmt.Errorf("%w: sandbox %s is %s (connect resumes it)", ErrConflict, id, r.State)
		}
		end := time.Now().UTC().Add(d)
		if onlyLater && end.Before(r.EndAt) {
			return errUnchanged
		}
		r.EndAt = end
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil, c.notFound(ctx, id)
		}
		return nil, err
	}
	return &r.Sandbox, nil
}

// Usage reads a sandbox's resource use from its node.
func (c *Cluster) Usage(ctx context.Context, id string) (node.Usage, *Sandbox, error) {
	sb, err := c.Get(ctx, id)
	if err != nil {
		return node.Usage{}, nil, err
	}
	if sb.State != StateRunning {
		return node.Usage{Since: time.Now()}, sb, nil // a paused sandbox uses nothing
	}
	u, err := c.cfg.Node.Usage(ctx, id)
	return u, sb, err
}

// StopMode says what Close does with running sandboxes.
type StopMode int

// Stop modes.
const (
	// StopKeep leaves them running and recorded, for the next server.
	StopKeep StopMode = iota
	// StopPause pauses each one first (a host that is going away).
	StopPause
	// StopKill kills each one and removes its record.
	StopKill
)

// Close stops following the store and campaigning; the cluster accepts no
// creates afterwards. What happens to the node's running sandboxes is
// mode's.
func (c *Cluster) Close(ctx context.Context, mode StopMode) error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	var errs []error
	if mode != StopKeep {
		self := c.cfg.Node.ID()
		for _, r := range c.recs.all() {
			if r.State != StateRunning || r.NodeID != self {
				continue
			}
			var err error
			if mode == StopPause {
				if err = c.Pause(ctx, r.ID); err != nil {
					c.log.Warn("pausing sandbox on stop failed; it keeps running", "sandbox_id", r.ID, "err", err)
				} else {
					c.log.Info("sandbox paused on stop", "sandbox_id", r.ID)
				}
				continue
			}
			if err = c.Kill(ctx, r.ID); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
			}
		}
	}
	if c.stop != nil {
		c.stop()
	}
	c.bg.Wait()
	return errors.Join(errs...)
}
