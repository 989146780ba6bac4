package cluster

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/netip"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// randomToken is a fresh secret for a sandbox.
func randomToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
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
	release, err := c.withinQuota(req.Owner, 1)
	if err != nil {
		return nil, err
	}
	defer release()
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
		Source:        &nodev1.CreateRequest_TemplateId{TemplateId: req.TemplateID},
		CpuCount:      int32(req.CPUCount),
		MemoryMb:      int32(req.MemoryMB),
		EnvVars:       req.EnvVars,
		AllowInternet: req.AllowInternet,
		Secure:        req.Secure,
		TeamId:        req.Owner.Team,
	}
	from := req.TemplateID
	if req.SnapshotID != "" {
		wreq.Source, from = &nodev1.CreateRequest_SnapshotId{SnapshotId: req.SnapshotID}, req.SnapshotID
	}
	p := placement{template: req.TemplateID, memoryMB: req.MemoryMB, cpus: req.CPUCount, only: volumeNode}
	if id == "" && len(mounts) == 0 && req.CPUCount == 0 && req.MemoryMB == 0 {
		// What a node's warm pool can serve (it holds its templates'
		// default resources, and its sandboxes come with their own ids).
		p.pool = poolKey(req.TemplateID, req.SnapshotID)
	}
	nsb, n, err := c.start(ctx, p, wreq, "")
	if err != nil {
		if errors.Is(err, nodeapi.ErrNotFound) {
			return nil, fmt.Errorf("%w: %q", ErrTemplateNotFound, from)
		}
		return nil, err
	}
	spec := req.Spec
	spec.Mounts = mounts
	return c.register(ctx, n, nsb, registration{spec: spec, requestedTemplate: cmp.Or(req.Requested, from),
		keyID: req.Owner.KeyID, team: req.Owner.Team})
}

// restoreRequest asks a node to restore sandbox id, of team, from snapshot
// snapID with spec's network: what a resume, a fork's child and a
// migration start from (the rest of the sandbox is in the snapshot).
func restoreRequest(id, team, snapID string, spec *Spec) *nodev1.CreateRequest {
	return &nodev1.CreateRequest{
		SandboxId:     id,
		TeamId:        team,
		Source:        &nodev1.CreateRequest_SnapshotId{SnapshotId: snapID},
		AllowInternet: spec.AllowInternet,
		AllowOut:      spec.Network.AllowOut,
		DenyOut:       spec.Network.DenyOut,
	}
}

// withinQuota refuses n more sandboxes for a key that runs as many as it
// may, and else counts them as starting until release: on this server the
// bound holds exactly, however many of the key's creates run at once (a
// batch's). Other servers count from their caches, so two servers
// creating at once may overshoot by a sandbox or two: a quota, not a
// security boundary.
func (c *Cluster) withinQuota(o Owner, n int) (release func(), err error) {
	if o.MaxSandboxes <= 0 {
		return func() {}, nil
	}
	running := 0
	c.recs.each(func(r *record) {
		if r.KeyID == o.KeyID && r.State == StateRunning {
			running++
		}
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	// A create whose record was just stored is counted twice until its
	// release: a refusal too many, never one too few.
	if running+c.starting[o.KeyID]+n > o.MaxSandboxes {
		return nil, fmt.Errorf("%w: the API key runs %d of its %d sandboxes (%d more starting)", ErrQuota, running, o.MaxSandboxes, c.starting[o.KeyID])
	}
	c.starting[o.KeyID] += n
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.starting[o.KeyID] -= n; c.starting[o.KeyID] <= 0 {
			delete(c.starting, o.KeyID)
		}
	}, nil
}

// placeAttempts bounds how many nodes one start tries.
const placeAttempts = 3

// start places a sandbox and starts it there, moving on to another node
// when one refuses for lack of room. A sandbox restored from a snapshot
// that node holder took gets it moved to its node first when no store
// holds it (bringSnapshot). The error is in the cluster's classes
// (classifyNodeError).
func (c *Cluster) start(ctx context.Context, p placement, req *nodev1.CreateRequest, holder string) (*nodev1.Sandbox, nodeapi.Node, error) {
	var err error
	for range placeAttempts {
		n, perr := c.nodes.place(p)
		if perr != nil {
			if err != nil {
				return nil, nil, err // the last node's own refusal says more
			}
			return nil, nil, perr
		}
		if snapID := req.GetSnapshotId(); snapID != "" {
			if err := c.bringSnapshot(ctx, req.SandboxId, snapID, holder, n); err != nil {
				return nil, nil, err
			}
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
		c.nodes.refusals.add(RefusedByNode)
		c.log.Info("node full; placing on another", "node_id", n.ID(), "err", err)
		p.exclude = append(p.exclude, n.ID())
		p.prefer = ""
	}
	return nil, nil, err
}

// dropLandedRecord removes r's record if its write, reported failed, landed
// all the same: a write whose answer was lost (the caller gone, as an
// atomic batch's others are once one fails, or the store cut off
// mid-write) may have been applied, and a record of the sandbox just
// killed would stay listed. Only r's own record goes, not another of its
// id.
func (c *Cluster) dropLandedRecord(ctx context.Context, r record) {
	ctx = context.WithoutCancel(ctx)
	_, err := c.recs.removeIf(ctx, r.ID, "its create failed", func(got *record) bool {
		return got.NodeID == r.NodeID && got.StartedAt.Equal(r.StartedAt)
	})
	if err != nil {
		c.log.Warn("removing the record of a sandbox whose create failed", "sandbox_id", r.ID, "err", err)
	}
}

// registration is what a new record takes beyond the node's description.
type registration struct {
	// spec is the sandbox's, whole (a create's, a fork's parent's).
	spec Spec
	// requestedTemplate is the name it was created from.
	requestedTemplate string
	keyID             string
	team              string
}

// register stores the record of a sandbox node n started. If the record
// cannot be stored the sandbox is killed: a sandbox nobody can find must
// not run.
func (c *Cluster) register(ctx context.Context, n nodeapi.Node, nsb *nodev1.Sandbox, reg registration) (*Sandbox, error) {
	id := nsb.Id
	addr, _ := netip.ParseAddr(nsb.Addr)
	started := nsb.StartedAt.AsTime().UTC()
	r := record{Sandbox: Sandbox{
		Spec:            reg.spec,
		ID:              id,
		TemplateID:      nsb.TemplateId,
		NodeID:          n.ID(),
		State:           StateRunning,
		StartedAt:       started,
		EndAt:           started.Add(reg.spec.Timeout),
		DiskMB:          int(nsb.DiskMb),
		EnvdVersion:     nsb.EnvdVersion,
		EnvdAccessToken: nsb.EnvdAccessToken,
		KeyID:           reg.keyID,
		Team:            reg.team,
		Addr:            addr,
	}}
	// What the node gave, not what was asked for.
	r.CPUCount, r.MemoryMB = int(nsb.CpuCount), int(nsb.MemoryMb)
	r.Metadata = maps.Clone(reg.spec.Metadata)
	r.AutoResume = reg.spec.AutoResume && reg.spec.AutoPause
	r.Network.AllowInternet = nil
	if reg.spec.PrivateTraffic {
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
		c.dropLandedRecord(ctx, r)
		return nil, fmt.Errorf("creating sandbox %s: %w", id, err)
	}
	out := r.Sandbox
	return &out, nil
}
