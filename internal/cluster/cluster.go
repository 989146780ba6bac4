// Package cluster is the control plane's model of the sandboxes it runs:
// their records (metadata, owners, deadlines), their placement on nodes and
// the timeouts that end them. The api package drives it; it drives nodes.
// The records live in the state store (etcd), never only in this process:
// a restarted server finds every sandbox where it left it, and the
// deadlines are enforced by whichever server wins the election. The node
// seam is the Node interface; today the one node is in-process.
package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/membership"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/sealed"
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
	// ErrQuota: the caller's key or team has as many sandboxes (or
	// bytes) as it may.
	ErrQuota = errors.New("quota reached")
)

// Owner is who a request acts for: the API key, its team (which owns
// what the request makes) and whether the key is an admin's (which acts
// across teams).
type Owner struct {
	KeyID string
	Team  string
	Admin bool
	// MaxSandboxes bounds the key's running sandboxes (0: no bound);
	// its team's quota comes from Config.TeamLimits.
	MaxSandboxes int
}

// Sees reports whether o may see and act on what team owns: its own
// team's, or anything for an admin.
func (o Owner) Sees(team string) bool { return o.Admin || o.Team == team }

// TeamLimits are a team's bounds the cluster enforces; zero is no bound.
type TeamLimits struct {
	// MaxSandboxes bounds the team's running sandboxes, across servers.
	MaxSandboxes int
	// MaxPaused bounds the paused sandboxes it keeps.
	MaxPaused int
	// MaxVolumeBytes and MaxSnapshotBytes bound the sizes of its volumes
	// and of its snapshots, in all.
	MaxVolumeBytes   int64
	MaxSnapshotBytes int64
}

// State is a sandbox's lifecycle state as E2B names it.
type State string

// States.
const (
	StateRunning State = "running"
	StatePaused  State = "paused"
)

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
	// Local is the node in this process (the single-host default); nil
	// for a pure API server.
	Local nodeapi.Node
	// Dial reaches the node agent registered at address; nil uses only
	// Local.
	Dial   func(id, address string) nodeapi.Node
	Limits Limits
	// PausedRetention, when positive, is how long a paused sandbox is
	// kept: past it the elected server deletes it and its snapshot, with
	// a log line. Zero keeps paused sandboxes until they are killed.
	PausedRetention time.Duration
	// State holds the records; required.
	State state.Store
	// OnGone, if set, is called after a sandbox is killed, paused, moved
	// or died (reason says why it died), e.g. to cut the proxy's
	// connections to it.
	OnGone func(id, reason string)
	// LegacyStateDir is where servers before the state store kept the
	// records of paused sandboxes (<dir>/paused/*.json); Open moves them
	// into the store once.
	LegacyStateDir string
	// Candidate names this server in the deadline election; it must be
	// unique to one server at a time (a restarted server evicts its dead
	// predecessor by it). Required.
	Candidate string
	// TickInterval is how often the elected server looks for deadlines
	// that passed; 0 means 250ms.
	TickInterval time.Duration
	// TeamLimits returns team's quota; nil bounds no team. It is asked
	// at every create, fork and resume (automatic ones too, which come
	// with no API key), so it must answer from memory.
	TeamLimits func(team string) TeamLimits
	// DataKeys seal the tokens of sandbox and volume records in the
	// store; nil stores them in clear (unit tests).
	DataKeys *sealed.Keyring
	Logger   *slog.Logger
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
	// AutoPauseFilesOnly makes that pause keep only the files (E2B's
	// autoPauseMemory: false).
	AutoPauseFilesOnly bool `json:"autoPauseFilesOnly,omitempty"`
	// AutoResume makes traffic to the paused sandbox resume it (with
	// AutoPause: E2B's lifecycle.autoResume).
	AutoResume bool `json:"autoResume,omitempty"`
	// Timeout is the timeout it was created with, which an automatic
	// resume gives it again.
	Timeout time.Duration `json:"timeout,omitempty"`
	// Addr is where the sandbox's ports are reached from its node.
	Addr netip.Addr `json:"addr,omitzero"`
	// SnapshotID holds a paused sandbox's state.
	SnapshotID string `json:"snapshotID,omitempty"`
	// PausedAt is when it was paused (zero while it runs).
	PausedAt time.Time `json:"pausedAt,omitzero"`
	// AllowInternet is the sandbox's egress setting, kept so that a resumed
	// sandbox or a fork's children get the same.
	AllowInternet bool `json:"allowInternet,omitempty"`
	// AllowOut and DenyOut are its egress rules (E2B's network.allowOut,
	// CIDRs, addresses and domains, and network.denyOut), kept so that a
	// resumed, forked or moved sandbox keeps them.
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
	// MaskRequestHost replaces the Host of requests to its ports.
	MaskRequestHost string `json:"maskRequestHost,omitempty"`
	// KeyID is the API key that created it (for the key's quota).
	KeyID string `json:"keyID,omitempty"`
	// Team owns it (TeamID says whose a record from before teams is).
	Team string `json:"team,omitempty"`
	// Mounts are the volumes it mounts (on its node, which it cannot
	// leave while it has them).
	Mounts []VolumeMount `json:"mounts,omitempty"`
	// TrafficAccessToken, when set (network.allowPublicTraffic false),
	// must come with every request to the sandbox's own ports.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
}

// TeamID is the team that owns the sandbox: its Team, or for a record
// from before teams, the team of its own its key has had since.
func (sb *Sandbox) TeamID() string {
	if sb.Team != "" {
		return sb.Team
	}
	return sb.KeyID
}

// CreateRequest describes a sandbox to create. EnvVars are handed to the
// sandbox and never stored: they are the user's secrets.
type CreateRequest struct {
	// TemplateID is what the node starts from: a template's id or a
	// snapshot's (the api resolves the client's names).
	TemplateID string
	// Requested is the name the client asked for, kept as the sandbox's
	// alias when it differs.
	Requested     string
	Timeout       time.Duration
	Metadata      map[string]string
	EnvVars       map[string]string
	AllowInternet bool
	Secure        bool
	AutoPause     bool
	// AutoPauseFilesOnly makes that pause keep only the files.
	AutoPauseFilesOnly bool
	AutoResume         bool
	CPUCount           int
	MemoryMB           int
	Owner              Owner
	// PrivateTraffic makes the sandbox's own ports need its traffic
	// access token (E2B's network.allowPublicTraffic false).
	PrivateTraffic bool
	// Mounts are volumes (by name or id) to mount; the sandbox goes to
	// their node.
	Mounts []VolumeMount
	// Network holds the egress rules and the Host mask.
	Network NetworkRules
	// IdempotencyKey, when set, makes a repeated create (same key, same
	// API key, within IdempotencyTTL) return the first one's sandbox.
	IdempotencyKey string
}

// Cluster tracks sandboxes. It is safe for concurrent use.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	recs  *records
	nodes *fleet

	mu     sync.Mutex
	closed bool
	// expiring holds the ids whose timeout this server is handling.
	expiring map[string]bool
	// leading is set while this server is the elected one (deadlines,
	// lost nodes, draining nodes).
	leading atomic.Bool

	// bg owns every goroutine the cluster starts; Close ends them.
	bg *tasks
}

// Open loads the records from the state store, moves legacy paused
// records into it, reconciles the records with the sandboxes the node
// runs (see reconcile) and starts following the store and campaigning to
// enforce deadlines. Close stops that.
func Open(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.State == nil || (cfg.Local == nil && cfg.Dial == nil) || cfg.Candidate == "" {
		return nil, errors.New("opening cluster: a state store, a node (local or remote) and a candidate name are required")
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
	c := &Cluster{cfg: cfg, log: cfg.Logger, recs: newRecords(cfg.State, cfg.DataKeys), expiring: map[string]bool{}}
	c.nodes = newFleet(cfg.State, cfg.Local, cfg.Dial, cfg.Logger)
	c.nodes.onEvent = c.nodeEvent
	if err := c.migrateLegacy(ctx); err != nil {
		return nil, err
	}
	start := time.Now()
	rev, err := c.recs.load(ctx)
	if err != nil {
		return nil, err
	}
	c.log.Info("sandbox records loaded", "records", len(c.recs.m), "took_ms", time.Since(start).Milliseconds())
	if cfg.Local != nil {
		if err := c.reconcile(ctx, cfg.Local); err != nil {
			return nil, err
		}
	}
	c.bg = newTasks(ctx)
	if err := c.nodes.start(c.bg); err != nil {
		c.bg.close()
		return nil, err
	}
	c.bg.Go(func(ctx context.Context) {
		c.recs.follow(ctx, rev, func(err error) { c.log.Warn("following sandbox records", "err", err) })
	})
	c.bg.Go(c.campaign)
	return c, nil
}

// nodeEvent handles what a node reports on its own.
func (c *Cluster) nodeEvent(nodeID string, ev *nodev1.Event) {
	switch ev.Kind {
	case nodev1.Event_KIND_EXITED, nodev1.Event_KIND_OOM_KILLED:
		c.forget(nodeID, ev.SandboxId, ev.Reason)
	case nodev1.Event_KIND_DRAINING:
		if c.leading.Load() && c.nodes.beginEvacuation(nodeID) {
			if !c.bg.Go(func(ctx context.Context) { c.evacuate(ctx, nodeID) }) {
				c.nodes.endEvacuation(nodeID)
			}
		}
	case nodev1.Event_KIND_SYNC:
		if c.cfg.Local == nil || nodeID != c.cfg.Local.ID() {
			c.bg.Go(func(context.Context) { c.syncNode(nodeID) })
		}
	}
}

// forget drops the record of a sandbox that died on its own on node
// nodeID, leaving the reason for whoever asks for it. Every server hears
// it; the first one's removal wins, and a sandbox that lives on another
// node by now (resumed elsewhere) is not touched.
func (c *Cluster) forget(nodeID, id, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	removed, err := c.recs.removeIf(ctx, id, reason, func(r *record) bool {
		return r.NodeID == nodeID && r.State == StateRunning
	})
	if err != nil {
		c.log.Error("removing record of exited sandbox", "sandbox_id", id, "err", err)
	}
	if removed {
		c.log.Warn("sandbox ended on its own", "sandbox_id", id, "reason", reason)
	}
	c.gone(id, reason)
}

// gone tells OnGone that sandbox id no longer runs where it did, and why
// when it ended on its own.
func (c *Cluster) gone(id, reason string) {
	if c.cfg.OnGone != nil {
		c.cfg.OnGone(id, reason)
	}
}

// Limits returns the cluster's limits.
func (c *Cluster) Limits() Limits { return c.cfg.Limits }

func (c *Cluster) validate(req *CreateRequest) error {
	if err := req.Network.validate(); err != nil {
		return err
	}
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
	case req.AutoResume && !req.AutoPause:
		return fmt.Errorf("%w: autoResume needs the sandbox to pause on timeout (autoPause)", ErrInvalid)
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

// randomToken is a fresh secret for a sandbox.
func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// truncate shortens s for an error message.
func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// Create validates req, places the sandbox on a node and starts it. A
// node that turns out to be full (its last report was older than its
// admission) hands the sandbox to the next candidate.
func (c *Cluster) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	if err := c.validate(&req); err != nil {
		return nil, err
	}
	var id string
	if req.IdempotencyKey != "" {
		// Before the quota: a retry of a create that took the key's last
		// slot gets that sandbox, not a quota error.
		id = ids.New()
		sb, err := c.reserveIdempotent(ctx, req.Owner, req.IdempotencyKey, id)
		if sb != nil || err != nil {
			return sb, err
		}
	}
	sb, err := c.withinQuotaCreate(ctx, req, id)
	switch {
	case req.IdempotencyKey == "":
	case err != nil:
		c.releaseIdempotent(context.WithoutCancel(ctx), req.Owner, req.IdempotencyKey)
	default:
		c.createdIdempotent(context.WithoutCancel(ctx), req.Owner, req.IdempotencyKey, sb.ID)
	}
	return sb, err
}

// withinQuotaCreate is create once the key's and the team's quotas allow
// it.
func (c *Cluster) withinQuotaCreate(ctx context.Context, req CreateRequest, id string) (*Sandbox, error) {
	if err := c.withinQuota(req.Owner, 1); err != nil {
		return nil, err
	}
	// The reservation is made before the sandbox has an id: a create
	// that names none may take a prestarted sandbox, whose id is its own.
	slot := id
	if slot == "" {
		slot = "starting-" + ids.New()
	}
	done, err := c.reserveRunning(ctx, req.Owner.Team, slot)
	if err != nil {
		return nil, err
	}
	sb, err := c.create(ctx, req, id)
	if err == nil && sb.ID != slot {
		c.renameSlot(context.WithoutCancel(ctx), req.Owner.Team, slot, sb.ID)
	}
	done(err == nil)
	return sb, err
}

// create is Create once validated, with the sandbox's id chosen (or
// empty: the node's choice).
func (c *Cluster) create(ctx context.Context, req CreateRequest, id string) (*Sandbox, error) {
	mounts, volumeNode, err := c.resolveMounts(ctx, req.Owner, req.Mounts)
	if err != nil {
		return nil, err
	}
	wreq := &nodev1.CreateRequest{
		AllowOut:      req.Network.AllowOut,
		DenyOut:       req.Network.DenyOut,
		Mounts:        mountsToWire(mounts),
		SandboxId:     id,
		TemplateId:    req.TemplateID,
		CpuCount:      int32(req.CPUCount),
		MemoryMb:      int32(req.MemoryMB),
		EnvVars:       req.EnvVars,
		AllowInternet: req.AllowInternet,
		Secure:        req.Secure,
	}
	nsb, n, err := c.start(ctx, placement{template: req.TemplateID, memoryMB: req.MemoryMB, cpus: req.CPUCount, only: volumeNode}, wreq)
	if err != nil {
		if nodeapi.Code(err) == connect.CodeNotFound {
			return nil, fmt.Errorf("%w: %q", ErrTemplateNotFound, req.TemplateID)
		}
		return nil, err
	}
	return c.register(ctx, n, nsb, registration{
		requestedTemplate: cmp.Or(req.Requested, req.TemplateID), metadata: req.Metadata, timeout: req.Timeout,
		autoPause: req.AutoPause, autoPauseFilesOnly: req.AutoPauseFilesOnly, autoResume: req.AutoResume, allowInternet: req.AllowInternet, keyID: req.Owner.KeyID,
		team: req.Owner.Team, privateTraffic: req.PrivateTraffic, mounts: mounts, network: req.Network,
	})
}

// withinQuota refuses n more sandboxes for a key that runs as many as it
// may. Servers count from their caches, so two servers creating at once
// may overshoot by a sandbox or two: a quota, not a security boundary.
func (c *Cluster) withinQuota(o Owner, n int) error {
	if o.MaxSandboxes <= 0 {
		return nil
	}
	running := 0
	c.recs.each(func(r *record) {
		if r.KeyID == o.KeyID && r.State == StateRunning {
			running++
		}
	})
	if running+n > o.MaxSandboxes {
		return fmt.Errorf("%w: the API key runs %d of its %d sandboxes", ErrQuota, running, o.MaxSandboxes)
	}
	return nil
}

// placeAttempts bounds how many nodes one start tries.
const placeAttempts = 3

// start places a sandbox and starts it there, moving on to another node
// when one refuses for lack of room. The error is in the cluster's
// classes (classifyNodeError).
func (c *Cluster) start(ctx context.Context, p placement, req *nodev1.CreateRequest) (*nodev1.Sandbox, nodeapi.Node, error) {
	var err error
	for range placeAttempts {
		n, perr := c.nodes.place(p)
		if perr != nil {
			if err != nil {
				return nil, nil, err // the last node's own refusal says more
			}
			return nil, nil, perr
		}
		var nsb *nodev1.Sandbox
		nsb, err = n.Create(ctx, req)
		if err == nil {
			return nsb, n, nil
		}
		err = classifyNodeError(err)
		if !errors.Is(err, ErrNoCapacity) || ctx.Err() != nil {
			return nil, nil, err
		}
		c.log.Info("node full; placing on another", "node_id", n.ID(), "err", err)
		p.exclude = append(p.exclude, n.ID())
		p.prefer = ""
	}
	return nil, nil, err
}

// registration is what a new record takes beyond the node's description.
type registration struct {
	requestedTemplate  string
	metadata           map[string]string
	timeout            time.Duration
	autoPause          bool
	autoPauseFilesOnly bool
	autoResume         bool
	allowInternet      bool
	keyID              string
	team               string
	privateTraffic     bool
	mounts             []VolumeMount
	network            NetworkRules
}

// register stores the record of a sandbox node n started. If the record
// cannot be stored the sandbox is killed: a sandbox nobody can find must
// not run.
func (c *Cluster) register(ctx context.Context, n nodeapi.Node, nsb *nodev1.Sandbox, reg registration) (*Sandbox, error) {
	id := nsb.Id
	addr, _ := netip.ParseAddr(nsb.Addr)
	started := nsb.StartedAt.AsTime().UTC()
	r := record{Sandbox: Sandbox{
		ID:                 id,
		TemplateID:         nsb.TemplateId,
		ClientID:           n.ID(),
		NodeID:             n.ID(),
		Metadata:           maps.Clone(reg.metadata),
		State:              StateRunning,
		StartedAt:          started,
		EndAt:              started.Add(reg.timeout),
		CPUCount:           int(nsb.CpuCount),
		MemoryMB:           int(nsb.MemoryMb),
		DiskMB:             int(nsb.DiskMb),
		EnvdVersion:        nsb.EnvdVersion,
		EnvdAccessToken:    nsb.EnvdAccessToken,
		AutoPause:          reg.autoPause,
		AutoPauseFilesOnly: reg.autoPauseFilesOnly,
		AutoResume:         reg.autoResume && reg.autoPause,
		Timeout:            reg.timeout,
		AllowInternet:      reg.allowInternet,
		KeyID:              reg.keyID,
		Team:               reg.team,
		Addr:               addr,
		Mounts:             reg.mounts,
		AllowOut:           reg.network.AllowOut,
		DenyOut:            reg.network.DenyOut,
		MaskRequestHost:    reg.network.MaskRequestHost,
	}}
	if reg.privateTraffic {
		r.TrafficAccessToken = randomToken()
	}
	if reg.requestedTemplate != nsb.TemplateId {
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
		if _, kerr := n.Kill(context.WithoutCancel(ctx), &nodev1.KillRequest{SandboxId: id}); kerr != nil {
			c.log.Error("killing unrecorded sandbox", "sandbox_id", id, "node_id", n.ID(), "err", kerr)
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

// Route is how the proxy reaches a sandbox's ports.
type Route struct {
	// Addr is the sandbox's address on its node.
	Addr netip.Addr
	// Via is the node agent that forwards to it (host:port); empty when
	// the sandbox runs on this server's own node.
	Via string
	// TrafficToken, when set, must come with requests to the sandbox's
	// own ports (not envd's).
	TrafficToken string
	// MaskRequestHost, when set, replaces the Host of requests to the
	// sandbox's own ports (${PORT} becomes the port).
	MaskRequestHost string
}

// Route says how to reach sandbox id's ports. The proxy asks it on every
// request, so it reads the caches without copying the record; an id they
// lack costs at most one bounded store read (see records.lookup).
func (c *Cluster) Route(ctx context.Context, id string) (Route, error) {
	a, nodeID, token, mask, ok := c.recs.route(id)
	if !ok {
		r, err := c.recs.lookup(ctx, id)
		if err != nil {
			return Route{}, err
		}
		a, nodeID, token, mask = r.Addr, r.NodeID, r.TrafficAccessToken, r.MaskRequestHost
	}
	if !a.IsValid() {
		return Route{}, fmt.Errorf("%w: sandbox %s is not running", ErrConflict, id)
	}
	via, ok := c.nodes.address(nodeID)
	if !ok {
		return Route{}, fmt.Errorf("%w: the node of sandbox %s (%s) is not reachable", ErrUnavailable, id, nodeID)
	}
	return Route{Addr: a, Via: via, TrafficToken: token, MaskRequestHost: mask}, nil
}

// GoneError is the ErrNotFound of a sandbox that existed in the last day:
// why it is gone, if it died, and whose it was (whom the reason, and its
// logs, may be shown to).
type GoneError struct {
	ID     string
	Reason string
	Team   string
}

func (e *GoneError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%v: %s: %s", ErrNotFound, e.ID, e.Reason)
	}
	return fmt.Sprintf("%v: %s", ErrNotFound, e.ID)
}

// Unwrap makes a GoneError an ErrNotFound.
func (e *GoneError) Unwrap() error { return ErrNotFound }

// NotFoundError is the ErrNotFound of an id nobody knows: what the API
// answers for another team's sandbox too, so that nothing tells the two
// apart.
func NotFoundError(id string) error { return fmt.Errorf("%w: %s", ErrNotFound, id) }

// notFound is the ErrNotFound for id, a GoneError if it existed lately.
func (c *Cluster) notFound(ctx context.Context, id string) error {
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	if t, ok := c.recs.whyGone(lctx, id); ok {
		return &GoneError{ID: id, Reason: t.Reason, Team: t.Team}
	}
	return NotFoundError(id)
}

// ListFilter selects sandboxes.
type ListFilter struct {
	// Metadata entries must all match.
	Metadata map[string]string
	// States, if not empty, must contain the sandbox's state.
	States []State
	// Teams, if not empty, must contain the sandbox's team.
	Teams []string
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
	if len(f.Teams) > 0 && !slices.Contains(f.Teams, sb.TeamID()) {
		return false
	}
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

// Leading reports whether this server is the elected one, which enforces
// deadlines and does the cluster's housekeeping.
func (c *Cluster) Leading() bool { return c.leading.Load() }

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
		c.deleteSnapshotQuietly(sb.SnapshotID, "paused sandbox's snapshot")
		return nil
	}
	defer c.gone(id, "")
	n, err := c.nodes.node(sb.NodeID)
	if err != nil {
		c.log.Warn("killed sandbox's node is unreachable; its record is gone", "sandbox_id", id, "err", err)
		return nil
	}
	_, err = n.Kill(ctx, &nodev1.KillRequest{SandboxId: id})
	if nodeapi.Code(err) == connect.CodeNotFound {
		return nil // it died meanwhile; the record is gone either way
	}
	if err != nil {
		return fmt.Errorf("killing sandbox %s on node %s: %w", id, sb.NodeID, err)
	}
	c.nodes.left(sb.NodeID, sb.MemoryMB)
	return nil
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

// StopMode says what Close does with running sandboxes (membership's:
// the node agents' too).
type StopMode = membership.StopMode

// Stop modes.
const (
	// StopKeep leaves them running and recorded, for the next server.
	StopKeep = membership.StopKeep
	// StopPause pauses each one first (a host that is going away).
	StopPause = membership.StopPause
	// StopKill kills each one and removes its record.
	StopKill = membership.StopKill
)

// Close stops following the store and campaigning; the cluster accepts no
// creates afterwards. What happens to the node's running sandboxes is
// mode's.
func (c *Cluster) Close(ctx context.Context, mode StopMode) error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	var errs []error
	if mode != StopKeep && c.cfg.Local != nil {
		self := c.cfg.Local.ID()
		for _, r := range c.recs.matching(func(r *record) bool { return r.State == StateRunning && r.NodeID == self }) {
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
	c.nodes.stopAll()
	c.bg.close()
	return errors.Join(errs...)
}
