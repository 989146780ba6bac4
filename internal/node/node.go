// Package node runs the sandboxes of one host: it joins a template's root
// filesystem, a network slot and a runtime driver into a running sandbox
// whose envd answers, and takes all of it apart again on kill. The cluster
// package drives it (in-process on a single host; across the network later),
// and nothing below it knows about the API.
package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/undo"
)

// EnvdPort is the port envd listens on inside every sandbox (E2B's).
const EnvdPort = 49983

// ErrNotFound is returned for a sandbox id this node does not run.
var ErrNotFound = errors.New("sandbox not found")

// ErrExists is returned when creating a sandbox whose id is taken.
var ErrExists = errors.New("sandbox already exists")

// Network hands out and takes back per-sandbox network slots.
type Network interface {
	Acquire(ctx context.Context, opts netns.SlotOptions) (*netns.Slot, error)
	Release(ctx context.Context, s *netns.Slot) error
}

// Config wires a node.
type Config struct {
	// ID names this node in logs and records.
	ID string
	// Runtime starts and stops sandboxes.
	Runtime runtime.Runtime
	// Network provides network slots.
	Network Network
	// Templates resolves template ids to root filesystems.
	Templates *template.Store
	// EnvdPath is the static envd binary placed in every sandbox.
	EnvdPath string
	// EnvdVersion is the version the envd binary reports.
	EnvdVersion string
	// DNSServers are given to sandboxes; empty means the host's.
	DNSServers []string
	// ReadyTimeout bounds the wait for envd after start; 0 means 15s.
	ReadyTimeout time.Duration
	// Logger receives the node's logs.
	Logger *slog.Logger
}

// CreateRequest describes a sandbox to start.
type CreateRequest struct {
	// SandboxID is the new sandbox's id, chosen by the caller.
	SandboxID string
	// TemplateID is a template id or alias.
	TemplateID string
	// CPUCount and MemoryMB override the template's defaults when > 0.
	CPUCount int
	MemoryMB int
	// EnvVars are set for every process in the sandbox.
	EnvVars map[string]string
	// Network controls the sandbox's egress.
	Network netns.SlotOptions
	// Secure makes envd demand a per-sandbox access token.
	Secure bool
}

// Sandbox is what a node knows of a sandbox it runs.
type Sandbox struct {
	ID              string
	TemplateID      string
	CPUCount        int
	MemoryMB        int
	DiskMB          int
	EnvdVersion     string
	EnvdAccessToken string
	// Addr is where the host reaches the sandbox (envd and user ports).
	Addr      netip.Addr
	StartedAt time.Time

	slot *netns.Slot
}

// Node runs sandboxes on this host. It is safe for concurrent use.
type Node struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*Sandbox
	// pending holds ids being created, so that a concurrent create or kill
	// of the same id sees it.
	pending map[string]struct{}
	onExit  func(id string)
}

// New returns a node; it does not start anything.
func New(cfg Config) (*Node, error) {
	if cfg.Runtime == nil || cfg.Network == nil || cfg.Templates == nil {
		return nil, errors.New("creating node: runtime, network and templates are required")
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 15 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.DNSServers) == 0 {
		cfg.DNSServers = hostDNSServers()
	}
	n := &Node{
		cfg:       cfg,
		log:       cfg.Logger.With("node_id", cfg.ID),
		sandboxes: make(map[string]*Sandbox),
		pending:   make(map[string]struct{}),
	}
	if en, ok := cfg.Runtime.(runtime.ExitNotifier); ok {
		go n.handleExits(en.Exits())
	}
	return n, nil
}

// OnExit registers fn to be told of every sandbox that died on its own
// (after the node has cleaned up after it).
func (n *Node) OnExit(fn func(id string)) {
	n.mu.Lock()
	n.onExit = fn
	n.mu.Unlock()
}

// handleExits frees what sandboxes that died on their own held (a memory
// cgroup OOM kill takes the whole gVisor sandbox) and reports them.
func (n *Node) handleExits(ids <-chan string) {
	for id := range ids {
		n.mu.Lock()
		sb, ok := n.sandboxes[id]
		delete(n.sandboxes, id)
		onExit := n.onExit
		n.mu.Unlock()
		if !ok {
			continue // a create in progress fails on its own
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := n.cfg.Runtime.Kill(ctx, id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
			n.log.Warn("cleaning up exited sandbox", "sandbox_id", id, "err", err)
		}
		if err := n.cfg.Network.Release(ctx, sb.slot); err != nil {
			n.log.Warn("releasing network of exited sandbox", "sandbox_id", id, "err", err)
		}
		cancel()
		n.log.Warn("sandbox exited unexpectedly (out of memory?); cleaned up", "sandbox_id", id)
		if onExit != nil {
			onExit(id)
		}
	}
}

// ID returns the node's id.
func (n *Node) ID() string { return n.cfg.ID }

// Create starts a sandbox and returns once its envd answers. A failed
// create leaves nothing behind.
func (n *Node) Create(ctx context.Context, req CreateRequest) (sb *Sandbox, err error) {
	log := n.log.With("sandbox_id", req.SandboxID)
	tpl, err := n.cfg.Templates.Get(req.TemplateID)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", req.SandboxID, err)
	}
	n.mu.Lock()
	_, running := n.sandboxes[req.SandboxID]
	_, creating := n.pending[req.SandboxID]
	if running || creating {
		n.mu.Unlock()
		return nil, fmt.Errorf("creating sandbox %s: %w", req.SandboxID, ErrExists)
	}
	n.pending[req.SandboxID] = struct{}{}
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		delete(n.pending, req.SandboxID)
		n.mu.Unlock()
	}()

	start := time.Now()
	var rollback undo.Stack
	defer func() {
		if err != nil {
			rollback.Run(context.WithoutCancel(ctx), log)
		}
	}()

	sb = &Sandbox{
		ID:          req.SandboxID,
		TemplateID:  tpl.ID,
		CPUCount:    pick(req.CPUCount, tpl.CPUCount),
		MemoryMB:    pick(req.MemoryMB, tpl.MemoryMB),
		DiskMB:      tpl.DiskMB,
		EnvdVersion: n.cfg.EnvdVersion,
	}
	if req.Secure {
		sb.EnvdAccessToken = randomToken()
	}

	slot, err := n.cfg.Network.Acquire(ctx, req.Network)
	if err != nil {
		return nil, fmt.Errorf("creating sandbox %s: acquiring network: %w", req.SandboxID, err)
	}
	rollback.Push("releasing network", func(ctx context.Context) error { return n.cfg.Network.Release(ctx, slot) })
	sb.slot, sb.Addr = slot, slot.HostAddr

	if err := n.cfg.Runtime.Create(ctx, runtime.Spec{
		ID:              req.SandboxID,
		RootFS:          tpl.RootFS,
		EnvdPath:        n.cfg.EnvdPath,
		EnvdPort:        EnvdPort,
		EnvdAccessToken: sb.EnvdAccessToken,
		NetNSPath:       slot.SandboxNSPath,
		HostAddr:        slot.HostAddr,
		CPUCount:        sb.CPUCount,
		MemoryMB:        sb.MemoryMB,
		DNSServers:      n.cfg.DNSServers,
	}); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: %w", req.SandboxID, err)
	}
	rollback.Push("killing sandbox", func(ctx context.Context) error { return n.cfg.Runtime.Kill(ctx, req.SandboxID) })
	started := time.Now()

	envd := newEnvdClient(sb.Addr, sb.EnvdAccessToken)
	readyCtx, cancel := context.WithTimeout(ctx, n.cfg.ReadyTimeout)
	defer cancel()
	if err := envd.waitReady(readyCtx); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: waiting for envd: %w", req.SandboxID, err)
	}
	ready := time.Now()
	if err := envd.init(ctx, initRequest{
		EnvVars:     req.EnvVars,
		AccessToken: sb.EnvdAccessToken,
		DefaultUser: "user",
		Timestamp:   time.Now().UTC(),
	}); err != nil {
		return nil, fmt.Errorf("creating sandbox %s: initialising envd: %w", req.SandboxID, err)
	}
	sb.StartedAt = time.Now().UTC()

	n.mu.Lock()
	n.sandboxes[sb.ID] = sb
	n.mu.Unlock()
	log.Info("sandbox created", "template_id", tpl.ID, "addr", sb.Addr,
		"runtime_ms", started.Sub(start).Milliseconds(),
		"envd_ready_ms", ready.Sub(started).Milliseconds(),
		"total_ms", time.Since(start).Milliseconds())
	return sb, nil
}

// Get returns a running sandbox.
func (n *Node) Get(id string) (*Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("looking up sandbox %s: %w", id, ErrNotFound)
	}
	return sb, nil
}

// List returns the running sandboxes ordered by id.
func (n *Node) List() []*Sandbox {
	n.mu.Lock()
	out := make([]*Sandbox, 0, len(n.sandboxes))
	for _, sb := range n.sandboxes {
		out = append(out, sb)
	}
	n.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Kill stops a sandbox and frees everything it held.
func (n *Node) Kill(ctx context.Context, id string) error {
	n.mu.Lock()
	sb, ok := n.sandboxes[id]
	delete(n.sandboxes, id)
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("killing sandbox %s: %w", id, ErrNotFound)
	}
	var errs []error
	if err := n.cfg.Runtime.Kill(ctx, id); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		errs = append(errs, err)
	}
	if err := n.cfg.Network.Release(ctx, sb.slot); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("killing sandbox %s: %w", id, err)
	}
	n.log.Info("sandbox killed", "sandbox_id", id)
	return nil
}

// Shutdown kills every sandbox.
func (n *Node) Shutdown(ctx context.Context) error {
	var errs []error
	for _, sb := range n.List() {
		if err := n.Kill(ctx, sb.ID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Stats reads a sandbox's resource use from the runtime.
func (n *Node) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if _, err := n.Get(id); err != nil {
		return runtime.Stats{}, err
	}
	return n.cfg.Runtime.Stats(ctx, id)
}

func pick(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
