// Package nodeserver answers the node API (nodeapi.Node) with a node in
// this process: the in-process node of a single-host server, and the node
// a node agent serves over the network (nodeapi.Handler). It is the node's
// side of the wire, so that package nodeapi holds only the wire and the
// control plane never links the node. Only the wiring (server, agent)
// imports it.
package nodeserver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/netns"
	"github.com/aenvhq/aenv/internal/node"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/template"
	"github.com/aenvhq/aenv/internal/volume"
)

// Local is the node API answered by a node in this process: the one of a
// single-host server, and the one a node agent serves (nodeapi.Handler).
// Its errors are Connect errors too, so callers cannot tell it from
// nodeapi.Remote.
type Local struct {
	n     *node.Node
	opts  LocalOptions
	pulls *puller

	mu     sync.Mutex
	subs   map[*subscriber]struct{}
	onExit []func(id, reason string)
}

// LocalOptions describe what the node package does not know of itself.
type LocalOptions struct {
	// Templates lists the templates the node holds (ids and aliases).
	Templates *template.Catalog
	// RuntimeVersion and Version are reported by Info.
	RuntimeVersion, Version string
	// Builds, when set, lets the node run template builds (Build).
	Builds *BuildConfig
	// Pulls, when set, lets the node pull templates (Pull).
	Pulls *PullConfig
	// ImageCache, when set, reads the node's block image cache (its image
	// server's figures) for Info; nil for a node that serves no block
	// images.
	ImageCache func(ctx context.Context) (blockimage.CacheStats, error)
}

// imageCacheTimeout bounds reading the image cache's figures for Info,
// which the node's heartbeat calls: an image server slow to answer costs
// the report its cache figures, not its renewal.
const imageCacheTimeout = time.Second

var _ nodeapi.Node = (*Local)(nil)

type subscriber struct {
	ch chan *nodev1.Event
}

// NewLocal serves n's node API. It takes over n's exit and idle reports.
func NewLocal(n *node.Node, opts LocalOptions) *Local {
	l := &Local{n: n, opts: opts, pulls: newPuller(opts.Pulls), subs: map[*subscriber]struct{}{}}
	n.OnExit(func(ex node.Exit) {
		l.mu.Lock()
		hooks := l.onExit
		l.mu.Unlock()
		for _, fn := range hooks {
			fn(ex.ID, ex.Reason)
		}
		kind := nodev1.Event_KIND_EXITED
		if ex.OutOfMemory {
			kind = nodev1.Event_KIND_OOM_KILLED
		}
		l.Publish(&nodev1.Event{Kind: kind, SandboxId: ex.ID, Reason: ex.Reason})
	})
	n.OnIdle(func(i node.Idle) {
		l.Publish(&nodev1.Event{Kind: nodev1.Event_KIND_IDLE, SandboxId: i.ID, Reason: i.Reason})
	})
	return l
}

// OnExit adds fn to what is told, in this process, of every sandbox that
// died on its own (before the event goes to subscribers).
func (l *Local) OnExit(fn func(id, reason string)) {
	l.mu.Lock()
	l.onExit = append(l.onExit, fn)
	l.mu.Unlock()
}

// Publish sends ev to every subscriber of Events. A subscriber that does
// not keep up loses its stream (and resynchronises), rather than hold
// the node up.
func (l *Local) Publish(ev *nodev1.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs {
		select {
		case s.ch <- ev:
		default:
			close(s.ch)
			delete(l.subs, s)
		}
	}
}

// ID implements nodeapi.Node.
func (l *Local) ID() string { return l.n.ID() }

// Info implements nodeapi.Node.
func (l *Local) Info(ctx context.Context, _ *nodev1.InfoRequest) (*nodev1.NodeInfo, error) {
	st := l.n.Stats()
	info := &nodev1.NodeInfo{
		Id: l.n.ID(),
		Capacity: &nodev1.Resources{CpuCount: int32(st.Capacity.CPUCount), MemoryMb: int32(st.Capacity.MemoryMB),
			DiskMb: int32(st.DiskMB)},
		Usage: &nodev1.Resources{CpuCount: int32(st.CommittedCPUs), MemoryMb: int32(st.UsedMemoryMB),
			CommittedMemoryMb: int32(st.CommittedMB), DiskMb: int32(st.DiskUsedMB)},
		Sandboxes:        int32(st.Sandboxes),
		Runtime:          st.Runtime,
		RuntimeVersion:   l.opts.RuntimeVersion,
		Version:          l.opts.Version,
		MemoryOvercommit: st.Capacity.MemoryOvercommit,
		MemoryHighWater:  st.Capacity.MemoryHighWater,
		HostMemoryMb:     int32(st.HostMemoryMB),
		Images:           l.n.RootImages(),
	}
	for _, k := range l.n.WarmPool().PerTemplate() {
		if k.Ready == 0 && k.Target == 0 {
			continue
		}
		info.Pool = append(info.Pool, &nodev1.PoolEntry{TemplateId: k.Key.TemplateID, SnapshotId: k.Key.SnapshotID,
			Ready: int32(k.Ready), Target: int32(k.Target), Prepared: k.Key.Restores})
	}
	if l.opts.ImageCache != nil {
		cctx, cancel := context.WithTimeout(ctx, imageCacheTimeout)
		cs, err := l.opts.ImageCache(cctx)
		cancel()
		if err == nil {
			info.ImageCache = &nodev1.ImageCache{Bytes: uint64(max(cs.Bytes, 0)), MaxBytes: uint64(max(cs.MaxBytes, 0)),
				Hits: uint64(max(cs.Hits, 0)), Misses: uint64(max(cs.Misses, 0)), Evictions: uint64(max(cs.Evictions, 0)),
				Mounted: int32(cs.Mounted)}
		}
	}
	if l.opts.Templates != nil {
		if ts, err := l.opts.Templates.ListLocal(); err == nil {
			for _, t := range ts {
				info.Templates = append(info.Templates, t.ID)
				info.Templates = append(info.Templates, t.Aliases...)
			}
		}
	}
	return info, nil
}

// Create implements nodeapi.Node.
func (l *Local) Create(ctx context.Context, req *nodev1.CreateRequest) (*nodev1.Sandbox, error) {
	// The id names the sandbox's files and runtime state on this host:
	// whoever calls, it must have an id's form.
	if req.SandboxId != "" && !ids.Valid(req.SandboxId) {
		return nil, nodeapi.NewError(connect.CodeInvalidArgument, fmt.Errorf("creating sandbox: malformed id %q", req.SandboxId))
	}
	opts, err := slotOptions(req.AllowInternet, req.AllowOut, req.DenyOut)
	if err != nil {
		return nil, nodeapi.NewError(connect.CodeInvalidArgument, err)
	}
	sb, err := l.n.Create(ctx, node.CreateRequest{
		SandboxID:  req.SandboxId,
		TemplateID: req.GetTemplateId(),
		SnapshotID: req.GetSnapshotId(),
		CPUCount:   int(req.CpuCount),
		MemoryMB:   int(req.MemoryMb),
		EnvVars:    req.EnvVars,
		Network:    opts,
		Secure:     req.Secure,
		Mounts:     mountsFromWire(req.Mounts),
		Reboot:     req.Reboot,
		TeamID:     req.TeamId,
	})
	if err != nil {
		return nil, wireError(err)
	}
	return sandboxToWire(sb), nil
}

// Kill implements nodeapi.Node.
func (l *Local) Kill(ctx context.Context, req *nodev1.KillRequest) (*nodev1.KillResponse, error) {
	if err := l.n.Kill(ctx, req.SandboxId); err != nil {
		return nil, wireError(err)
	}
	return &nodev1.KillResponse{}, nil
}

// List implements nodeapi.Node.
func (l *Local) List(ctx context.Context, req *nodev1.ListRequest) (*nodev1.ListResponse, error) {
	out := &nodev1.ListResponse{}
	var last map[string]node.Sample
	if req.GetUsage() {
		last = l.n.LastSamples()
	}
	for _, sb := range l.n.List() {
		w := sandboxToWire(sb)
		if s, ok := last[sb.ID]; ok {
			w.Usage = sampleToWire(s)
		}
		out.Sandboxes = append(out.Sandboxes, w)
	}
	return out, nil
}

// Snapshot implements nodeapi.Node.
func (l *Local) Snapshot(ctx context.Context, req *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	kind := snapshot.Kind(req.Kind)
	switch kind {
	case snapshot.KindSnapshot, snapshot.KindPause, snapshot.KindFork:
	default:
		return nil, nodeapi.NewError(connect.CodeInvalidArgument, fmt.Errorf("unknown snapshot kind %q", req.Kind))
	}
	if req.FilesOnly && (!req.Stop || kind != snapshot.KindPause) {
		return nil, nodeapi.NewError(connect.CodeInvalidArgument, errors.New("files_only is for a pause (kind pause, stop)"))
	}
	s, err := l.n.Snapshot(ctx, req.SandboxId, node.SnapshotOptions{Kind: kind, Names: req.Names, Stop: req.Stop, FilesOnly: req.FilesOnly})
	if err != nil {
		return nil, wireError(err)
	}
	return nodeapi.SnapshotToWire(s), nil
}

// Stats implements nodeapi.Node.
func (l *Local) Stats(ctx context.Context, req *nodev1.StatsRequest) (*nodev1.SandboxStats, error) {
	u, err := l.n.Usage(ctx, req.SandboxId)
	if err != nil {
		return nil, wireError(err)
	}
	return &nodev1.SandboxStats{MemoryBytes: u.MemoryBytes, CpuSinceNanos: u.CPUSinceNanos, Since: timestamppb.New(u.Since)}, nil
}

// ListSnapshots implements nodeapi.Node.
func (l *Local) ListSnapshots(ctx context.Context, req *nodev1.ListSnapshotsRequest) (*nodev1.ListSnapshotsResponse, error) {
	kinds := make([]snapshot.Kind, len(req.Kinds))
	for i, k := range req.Kinds {
		kinds[i] = snapshot.Kind(k)
	}
	ss, err := l.n.Snapshots(ctx, kinds...)
	if err != nil {
		return nil, wireError(err)
	}
	out := &nodev1.ListSnapshotsResponse{}
	for _, s := range ss {
		out.Snapshots = append(out.Snapshots, nodeapi.SnapshotToWire(s))
	}
	return out, nil
}

// GetSnapshot implements nodeapi.Node.
func (l *Local) GetSnapshot(ctx context.Context, req *nodev1.GetSnapshotRequest) (*nodev1.SnapshotInfo, error) {
	s, err := l.n.GetSnapshot(ctx, req.IdOrName)
	if err != nil {
		return nil, wireError(err)
	}
	return nodeapi.SnapshotToWire(s), nil
}

// DeleteSnapshot implements nodeapi.Node.
func (l *Local) DeleteSnapshot(ctx context.Context, req *nodev1.DeleteSnapshotRequest) (*nodev1.DeleteSnapshotResponse, error) {
	if err := l.n.DeleteSnapshot(ctx, req.Id); err != nil {
		return nil, wireError(err)
	}
	return &nodev1.DeleteSnapshotResponse{}, nil
}

// slotOptions are the network rules of a create or an update as the
// node's network applies them (nodeapi.ParseEgressRules reads them).
func slotOptions(allowInternet bool, allowOut, denyOut []string) (netns.SlotOptions, error) {
	r, err := nodeapi.ParseEgressRules(allowOut, denyOut)
	if err != nil {
		return netns.SlotOptions{}, err
	}
	return netns.SlotOptions{AllowInternet: allowInternet, AllowOut: r.AllowOut, DenyOut: r.DenyOut, AllowDomains: r.AllowDomains}, nil
}

// ExportVolume implements nodeapi.Node.
func (l *Local) ExportVolume(ctx context.Context, req *nodev1.ExportVolumeRequest) (*nodev1.ExportVolumeResponse, error) {
	n, err := l.n.ExportVolume(ctx, req.VolumeId)
	if err != nil {
		return nil, wireError(err)
	}
	return &nodev1.ExportVolumeResponse{Bytes: n}, nil
}

// ImportVolume implements nodeapi.Node.
func (l *Local) ImportVolume(ctx context.Context, req *nodev1.ImportVolumeRequest) (*nodev1.ImportVolumeResponse, error) {
	if err := l.n.ImportVolume(ctx, req.VolumeId); err != nil {
		return nil, wireError(err)
	}
	return &nodev1.ImportVolumeResponse{}, nil
}

// UpdateNetwork implements nodeapi.Node.
func (l *Local) UpdateNetwork(ctx context.Context, req *nodev1.UpdateNetworkRequest) (*nodev1.UpdateNetworkResponse, error) {
	opts, err := slotOptions(req.AllowInternet, req.AllowOut, req.DenyOut)
	if err != nil {
		return nil, nodeapi.NewError(connect.CodeInvalidArgument, err)
	}
	if err := l.n.UpdateNetwork(ctx, req.SandboxId, opts); err != nil {
		return nil, wireError(err)
	}
	return &nodev1.UpdateNetworkResponse{}, nil
}

// CreateVolume implements nodeapi.Node.
func (l *Local) CreateVolume(ctx context.Context, req *nodev1.CreateVolumeRequest) (*nodev1.CreateVolumeResponse, error) {
	size, err := l.n.CreateVolume(req.VolumeId, req.SizeBytes)
	if err != nil {
		return nil, wireError(err)
	}
	return &nodev1.CreateVolumeResponse{SizeBytes: size}, nil
}

// DeleteVolume implements nodeapi.Node.
func (l *Local) DeleteVolume(ctx context.Context, req *nodev1.DeleteVolumeRequest) (*nodev1.DeleteVolumeResponse, error) {
	if err := l.n.DeleteVolume(req.VolumeId); err != nil {
		return nil, wireError(err)
	}
	return &nodev1.DeleteVolumeResponse{}, nil
}

func mountsFromWire(ms []*nodev1.VolumeMount) []snapshot.Mount {
	var out []snapshot.Mount
	for _, m := range ms {
		out = append(out, snapshot.Mount{VolumeID: m.VolumeId, Path: m.Path})
	}
	return out
}

// Logs implements nodeapi.Node.
func (l *Local) Logs(ctx context.Context, req *nodev1.LogsRequest) (*nodev1.LogsResponse, error) {
	entries, err := l.n.Logs(req.SandboxId)
	if err != nil {
		return nil, wireError(err)
	}
	out := &nodev1.LogsResponse{}
	for _, e := range entries {
		out.Entries = append(out.Entries, &nodev1.LogEntry{Timestamp: timestamppb.New(e.At), Level: e.Level, Message: e.Message, Fields: e.Fields})
	}
	return out, nil
}

// Metrics implements nodeapi.Node.
func (l *Local) Metrics(ctx context.Context, req *nodev1.MetricsRequest) (*nodev1.MetricsResponse, error) {
	samples, err := l.n.Metrics(req.SandboxId)
	if err != nil {
		return nil, wireError(err)
	}
	out := &nodev1.MetricsResponse{}
	for _, s := range samples {
		out.Samples = append(out.Samples, sampleToWire(s))
	}
	return out, nil
}

func sampleToWire(s node.Sample) *nodev1.MetricSample {
	return &nodev1.MetricSample{Timestamp: timestamppb.New(s.At), CpuUsedPct: s.CPUUsedPct,
		CpuCount: int32(s.CPUCount), MemUsed: s.MemUsed, MemTotal: s.MemTotal, DiskUsed: s.DiskUsed, DiskTotal: s.DiskTotal}
}

// subscriberBuffer is how many events a slow subscriber may fall behind.
const subscriberBuffer = 256

// Events implements nodeapi.Node.
func (l *Local) Events(ctx context.Context, fn func(*nodev1.Event)) error {
	s := &subscriber{ch: make(chan *nodev1.Event, subscriberBuffer)}
	l.mu.Lock()
	l.subs[s] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if _, ok := l.subs[s]; ok {
			delete(l.subs, s)
		}
		l.mu.Unlock()
	}()
	fn(&nodev1.Event{Kind: nodev1.Event_KIND_SYNC})
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-s.ch:
			if !ok {
				return errors.New("node events: the subscriber fell behind")
			}
			fn(ev)
		}
	}
}

// wireError gives a node error its Connect code.
func wireError(err error) error {
	code := connect.CodeInternal
	switch {
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	case errors.Is(err, node.ErrNotFound), errors.Is(err, snapshot.ErrNotFound), errors.Is(err, template.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, volume.ErrNotFound):
		code = connect.CodeNotFound
	case errors.Is(err, node.ErrTooLarge), errors.Is(err, node.ErrInvalid):
		code = connect.CodeInvalidArgument
	case errors.Is(err, node.ErrNoCapacity):
		code = connect.CodeResourceExhausted
	case errors.Is(err, node.ErrExists):
		code = connect.CodeAlreadyExists
	case errors.Is(err, node.ErrIncompatible), errors.Is(err, node.ErrNoRootImage):
		code = connect.CodeFailedPrecondition
	case errors.Is(err, node.ErrUnsupported):
		code = connect.CodeUnimplemented
	}
	return nodeapi.NewError(code, err)
}

func sandboxToWire(sb *node.Sandbox) *nodev1.Sandbox {
	out := &nodev1.Sandbox{
		Id:              sb.ID,
		TemplateId:      sb.TemplateID,
		CpuCount:        int32(sb.CPUCount),
		MemoryMb:        int32(sb.MemoryMB),
		DiskMb:          int32(sb.DiskMB),
		EnvdVersion:     sb.EnvdVersion,
		EnvdAccessToken: sb.EnvdAccessToken,
		StartedAt:       timestamppb.New(sb.StartedAt),
	}
	if sb.Addr.IsValid() {
		out.Addr = sb.Addr.String()
	}
	return out
}
