package nodetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
	"github.com/aenvhq/aenv/internal/transfer"
)

// FakeTemplate is the template every Fake holds.
const FakeTemplate = "base"

// Fake is a node API with nothing behind it: sandboxes are records in
// memory, answered with the Connect codes the real node answers with (the
// suite holds it to that). The cluster's unit tests run over it; their
// knobs (SetFull, Exit, ...) stand for what a real node does on its own.
// It is safe for concurrent use.
//
// A method of nodeapi.Node it does not model answers
// connect.CodeUnimplemented (see unimplemented), so that a new RPC can
// be added to the interface before the fake learns it.
type Fake struct {
	id string
	// lists counts List calls.
	lists atomic.Int32
	// events carries what Publish sends to the one subscriber that takes
	// it: a sender waits for a subscriber, as on a node whose stream is
	// slow.
	events chan *nodev1.Event

	mu       sync.Mutex
	memoryMB int
	cpus     int
	full     bool
	delay    time.Duration
	// creating counts the creates under way, peakCreating the most at
	// once so far.
	creating, peakCreating int
	running                map[string]*fakeSandbox
	killed                 []string
	volumes                map[string]int64
	// store holds the snapshots; fakes made by NewFakes share one, as
	// nodes with a snapshot store do.
	store *fakeStore
	// incoming holds the files of snapshots arriving (ImportSnapshot),
	// by snapshot and file.
	incoming map[string]map[string][]byte
	// templates are the templates the node holds besides FakeTemplate
	// (imported with a snapshot).
	templates map[string]bool
	// cutAfter, when positive, cuts the next export's stream after that
	// many chunks; exports counts ExportSnapshot calls.
	cutAfter int
	exports  int
	// pooled is what its warm pool holds of FakeTemplate; a create of it
	// that names no id takes one (SetPooled).
	pooled int
	// prepared is what its warm pool holds prepared for restores of
	// FakeTemplate; each restore takes one (SetPrepared).
	prepared int
	// imageCache is what Info reports of its block image cache (nil: it
	// serves none).
	imageCache *nodev1.ImageCache
}

type fakeSandbox struct {
	wire *nodev1.Sandbox
	env  map[string]string
}

type fakeStore struct {
	mu    sync.Mutex
	seq   int
	snaps map[string]*snapshot.Snapshot
}

var _ nodeapi.Node = (*Fake)(nil)

// NewFake returns a node of 2 CPUs and 4 GiB holding FakeTemplate.
func NewFake(id string) *Fake {
	return &Fake{id: id, memoryMB: 4096, cpus: 2, running: map[string]*fakeSandbox{},
		volumes: map[string]int64{}, store: &fakeStore{snaps: map[string]*snapshot.Snapshot{}},
		incoming: map[string]map[string][]byte{}, templates: map[string]bool{},
		events: make(chan *nodev1.Event, 16)}
}

// NewFakes returns nodes that share one snapshot store.
func NewFakes(ids ...string) []*Fake {
	var out []*Fake
	for _, id := range ids {
		n := NewFake(id)
		if len(out) > 0 {
			n.store = out[0].store
		}
		out = append(out, n)
	}
	return out
}

// SetMemoryMB sets the node's memory capacity.
func (n *Fake) SetMemoryMB(mb int) {
	n.mu.Lock()
	n.memoryMB = mb
	n.mu.Unlock()
}

// SetFull makes the node refuse creates (ResourceExhausted) as one whose
// admission says no, or take them again.
func (n *Fake) SetFull(full bool) {
	n.mu.Lock()
	n.full = full
	n.mu.Unlock()
}

// SetPooled makes the node report n sandboxes of FakeTemplate prestarted
// in its warm pool; each create of it that names no id takes one.
func (n *Fake) SetPooled(count int) {
	n.mu.Lock()
	n.pooled = count
	n.mu.Unlock()
}

// SetPrepared makes the node report n sandboxes prepared for restores of
// FakeTemplate in its warm pool; each restore takes one.
func (n *Fake) SetPrepared(count int) {
	n.mu.Lock()
	n.prepared = count
	n.mu.Unlock()
}

// SetImageCache makes Info report c as the node's block image cache.
func (n *Fake) SetImageCache(c *nodev1.ImageCache) {
	n.mu.Lock()
	n.imageCache = c
	n.mu.Unlock()
}

// FakeMemUsed is the memory each of a Fake's sandboxes uses, as List
// with usage reports it.
const FakeMemUsed = 64 << 20

// SetDelay makes each create take d (starts that overlap in time).
func (n *Fake) SetDelay(d time.Duration) {
	n.mu.Lock()
	n.delay = d
	n.mu.Unlock()
}

// PeakCreates is the most creates the node has had under way at once.
func (n *Fake) PeakCreates() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.peakCreating
}

// Lists counts the List calls so far: a control plane that subscribed to
// the node's events reconciles with it (the first event is a SYNC) by
// listing.
func (n *Fake) Lists() int32 { return n.lists.Load() }

// Killed lists the ids Kill was called with, in order, known or not.
func (n *Fake) Killed() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.killed)
}

// IsRunning says whether the node runs sandbox id.
func (n *Fake) IsRunning(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.running[id]
	return ok
}

// Running counts the sandboxes the node runs.
func (n *Fake) Running() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.running)
}

// EnvVars are the environment sandbox id was created with (nil if the
// node does not run it).
func (n *Fake) EnvVars(id string) map[string]string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if sb, ok := n.running[id]; ok {
		return maps.Clone(sb.env)
	}
	return nil
}

// Vanish makes the node lose sandbox id without a word (a host that
// rebooted, a record the control plane has and the node not).
func (n *Fake) Vanish(id string) {
	n.mu.Lock()
	delete(n.running, id)
	n.mu.Unlock()
}

// Adopt makes the node run sb without anyone having asked for it (a
// sandbox the control plane has no record of).
func (n *Fake) Adopt(sb *nodev1.Sandbox) {
	n.mu.Lock()
	n.running[sb.Id] = &fakeSandbox{wire: sb}
	n.mu.Unlock()
}

// Exit makes sandbox id die on its own, reported as the node reports it
// (an EXITED event, which Exit waits to hand to a subscriber).
func (n *Fake) Exit(id, reason string) {
	n.Vanish(id)
	n.events <- &nodev1.Event{Kind: nodev1.Event_KIND_EXITED, SandboxId: id, Reason: reason}
}

// Publish hands ev to a subscriber of Events, waiting for one until ctx
// ends (its error).
func (n *Fake) Publish(ctx context.Context, ev *nodev1.Event) error {
	select {
	case n.events <- ev:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// PutSnapshot adds s to the node's snapshot store.
func (n *Fake) PutSnapshot(s *snapshot.Snapshot) { n.store.put(s) }

// HasSnapshot says whether the node's snapshot store holds id.
func (n *Fake) HasSnapshot(id string) bool { return n.store.get(id) != nil }

// SnapshotCount counts the snapshots in the node's store.
func (n *Fake) SnapshotCount() int { return len(n.store.list()) }

func (s *fakeStore) get(idOrName string) *snapshot.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if snap, ok := s.snaps[idOrName]; ok {
		return snap
	}
	for _, snap := range s.snaps {
		if slices.Contains(snap.Names, idOrName) {
			return snap
		}
	}
	return nil
}

func (s *fakeStore) put(snap *snapshot.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snaps[snap.ID] = snap
}

func (s *fakeStore) list() []*snapshot.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Values(s.snaps))
}

func notFound(format string, args ...any) error {
	return nodeapi.NewError(connect.CodeNotFound, fmt.Errorf(format, args...))
}

func invalid(format string, args ...any) error {
	return nodeapi.NewError(connect.CodeInvalidArgument, fmt.Errorf(format, args...))
}

// unimplemented is the answer of an RPC the fake does not model.
func unimplemented(rpc string) error {
	return nodeapi.NewError(connect.CodeUnimplemented, fmt.Errorf("the fake node does not implement %s", rpc))
}

// ID implements nodeapi.Node.
func (n *Fake) ID() string { return n.id }

// Info implements nodeapi.Node.
func (n *Fake) Info(context.Context, *nodev1.InfoRequest) (*nodev1.NodeInfo, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	committed, cpus := 0, 0
	for _, sb := range n.running {
		committed += int(sb.wire.MemoryMb)
		cpus += int(sb.wire.CpuCount)
	}
	info := &nodev1.NodeInfo{Id: n.id, Capacity: &nodev1.Resources{CpuCount: int32(n.cpus), MemoryMb: int32(n.memoryMB)},
		Usage: &nodev1.Resources{CpuCount: int32(cpus), CommittedMemoryMb: int32(committed)}, Runtime: "fake",
		Sandboxes: int32(len(n.running)), Templates: []string{FakeTemplate}, ImageCache: n.imageCache}
	if n.pooled > 0 {
		info.Pool = []*nodev1.PoolEntry{{TemplateId: FakeTemplate, Ready: int32(n.pooled), Target: int32(n.pooled)}}
	}
	if n.prepared > 0 {
		info.Pool = append(info.Pool, &nodev1.PoolEntry{TemplateId: FakeTemplate, Ready: int32(n.prepared), Target: int32(n.prepared), Prepared: true})
	}
	return info, nil
}

// Create implements nodeapi.Node.
func (n *Fake) Create(ctx context.Context, req *nodev1.CreateRequest) (*nodev1.Sandbox, error) {
	n.mu.Lock()
	delay := n.delay
	n.creating++
	n.peakCreating = max(n.peakCreating, n.creating)
	n.mu.Unlock()
	defer func() {
		n.mu.Lock()
		n.creating--
		n.mu.Unlock()
	}()
	select {
	case <-time.After(delay):
	case <-ctx.Done():
		return nil, nodeapi.NewError(connect.CodeCanceled, ctx.Err())
	}
	if _, err := nodeapi.ParseEgressRules(req.AllowOut, req.DenyOut); err != nil {
		return nil, invalid("creating sandbox: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if int(req.MemoryMb) > n.memoryMB || int(req.CpuCount) > n.cpus {
		return nil, invalid("creating sandbox: %d CPUs and %d MiB exceed node %s's %d and %d", req.CpuCount, req.MemoryMb, n.id, n.cpus, n.memoryMB)
	}
	if n.full {
		return nil, nodeapi.NewError(connect.CodeResourceExhausted, fmt.Errorf("creating sandbox: node %s is full", n.id))
	}
	id := req.SandboxId
	if id == "" {
		id = ids.New()
		if req.GetTemplateId() == FakeTemplate && n.pooled > 0 {
			n.pooled--
		}
	} else if !ids.Valid(id) {
		return nil, invalid("creating sandbox: malformed id %q", id)
	}
	if req.GetSnapshotId() != "" && n.prepared > 0 {
		n.prepared--
	}
	if _, ok := n.running[id]; ok {
		return nil, nodeapi.NewError(connect.CodeAlreadyExists, fmt.Errorf("creating sandbox %s: it exists", id))
	}
	for _, m := range req.Mounts {
		if _, ok := n.volumes[m.VolumeId]; !ok {
			return nil, notFound("creating sandbox %s: volume %s is not on node %s", id, m.VolumeId, n.id)
		}
		if len(m.Path) == 0 || m.Path[0] != '/' || m.Path == "/" {
			return nil, invalid("creating sandbox %s: mount path %q must be absolute and not /", id, m.Path)
		}
	}
	sb := &nodev1.Sandbox{Id: id, TemplateId: FakeTemplate, CpuCount: 2, MemoryMb: 512,
		StartedAt: timestamppb.Now(), Addr: "10.0.0.1", EnvdVersion: "fake"}
	env := maps.Clone(req.EnvVars)
	if tpl := req.GetTemplateId(); req.GetSnapshotId() == "" && tpl != FakeTemplate && !n.templates[tpl] {
		return nil, notFound("creating sandbox %s: template %q not found", id, tpl)
	}
	if snapID := req.GetSnapshotId(); snapID != "" {
		snap := n.store.get(snapID)
		if snap == nil {
			return nil, notFound("creating sandbox %s: snapshot %q not found", id, snapID)
		}
		if snap.TemplateID != "" && snap.TemplateID != FakeTemplate && !n.templates[snap.TemplateID] {
			return nil, notFound("restoring snapshot %s: template %q not found", snap.ID, snap.TemplateID)
		}
		if snap.Kind == snapshot.KindPause && snap.SandboxID != id {
			return nil, invalid("creating sandbox %s: snapshot %s is the pause of sandbox %s", id, snap.ID, snap.SandboxID)
		}
		// A restore keeps the saved sandbox's resources and environment,
		// whatever asked; a resumed sandbox keeps its token, and any other
		// started from a saved one that had a token gets one of its own.
		sb.TemplateId, sb.CpuCount, sb.MemoryMb = snap.TemplateID, int32(snap.CPUCount), int32(snap.MemoryMB)
		env = maps.Clone(snap.EnvVars)
		switch {
		case snap.Kind == snapshot.KindPause:
			sb.EnvdAccessToken = snap.EnvdAccessToken
		case snap.EnvdAccessToken != "":
			sb.EnvdAccessToken = ids.New()
		}
	} else {
		sb.TemplateId = req.GetTemplateId()
		if req.CpuCount > 0 {
			sb.CpuCount = req.CpuCount
		}
		if req.MemoryMb > 0 {
			sb.MemoryMb = req.MemoryMb
		}
	}
	if req.Secure && sb.EnvdAccessToken == "" {
		sb.EnvdAccessToken = ids.New()
	}
	n.running[id] = &fakeSandbox{wire: sb, env: env}
	return sb, nil
}

// Kill implements nodeapi.Node.
func (n *Fake) Kill(ctx context.Context, req *nodev1.KillRequest) (*nodev1.KillResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.killed = append(n.killed, req.SandboxId)
	if _, ok := n.running[req.SandboxId]; !ok {
		return nil, notFound("killing sandbox %s: not found", req.SandboxId)
	}
	delete(n.running, req.SandboxId)
	return &nodev1.KillResponse{}, nil
}

// List implements nodeapi.Node.
func (n *Fake) List(_ context.Context, req *nodev1.ListRequest) (*nodev1.ListResponse, error) {
	n.lists.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	out := &nodev1.ListResponse{}
	for _, sb := range n.running {
		w := sb.wire
		if req.GetUsage() {
			// Each sandbox half busy, using FakeMemUsed of its memory.
			w = proto.CloneOf(w)
			w.Usage = &nodev1.MetricSample{Timestamp: timestamppb.Now(), CpuUsedPct: 50, CpuCount: w.CpuCount,
				MemUsed: FakeMemUsed, MemTotal: uint64(w.MemoryMb) << 20, DiskTotal: uint64(w.DiskMb) << 20}
		}
		out.Sandboxes = append(out.Sandboxes, w)
	}
	slices.SortFunc(out.Sandboxes, func(a, b *nodev1.Sandbox) int { return strings.Compare(a.Id, b.Id) })
	return out, nil
}

// Snapshot implements nodeapi.Node.
func (n *Fake) Snapshot(ctx context.Context, req *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	kind := snapshot.Kind(req.Kind)
	switch kind {
	case snapshot.KindSnapshot, snapshot.KindPause, snapshot.KindFork:
	default:
		return nil, invalid("snapshotting sandbox %s: unknown snapshot kind %q", req.SandboxId, req.Kind)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.running[req.SandboxId]
	if !ok {
		return nil, notFound("snapshotting sandbox %s: not found", req.SandboxId)
	}
	n.store.mu.Lock()
	n.store.seq++
	seq := n.store.seq
	n.store.mu.Unlock()
	s := &snapshot.Snapshot{ID: fmt.Sprintf("snap%d", seq), Names: req.Names, Kind: kind, SandboxID: req.SandboxId,
		TemplateID: sb.wire.TemplateId, CPUCount: int(sb.wire.CpuCount), MemoryMB: int(sb.wire.MemoryMb),
		EnvdAccessToken: sb.wire.EnvdAccessToken, EnvVars: maps.Clone(sb.env), CreatedAt: time.Now(), Runtime: "fake"}
	n.store.put(s)
	if req.Stop {
		delete(n.running, req.SandboxId)
	}
	return nodeapi.SnapshotToWire(s), nil
}

// Stats implements nodeapi.Node.
func (n *Fake) Stats(ctx context.Context, req *nodev1.StatsRequest) (*nodev1.SandboxStats, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.running[req.SandboxId]
	if !ok {
		return nil, notFound("reading the stats of sandbox %s: not found", req.SandboxId)
	}
	return &nodev1.SandboxStats{MemoryBytes: uint64(sb.wire.MemoryMb) << 19, Since: sb.wire.StartedAt}, nil
}

// ListSnapshots implements nodeapi.Node.
func (n *Fake) ListSnapshots(ctx context.Context, req *nodev1.ListSnapshotsRequest) (*nodev1.ListSnapshotsResponse, error) {
	out := &nodev1.ListSnapshotsResponse{}
	for _, s := range n.store.list() {
		if len(req.Kinds) == 0 || slices.Contains(req.Kinds, string(s.Kind)) {
			out.Snapshots = append(out.Snapshots, nodeapi.SnapshotToWire(s))
		}
	}
	return out, nil
}

// GetSnapshot implements nodeapi.Node.
func (n *Fake) GetSnapshot(ctx context.Context, req *nodev1.GetSnapshotRequest) (*nodev1.SnapshotInfo, error) {
	if s := n.store.get(req.IdOrName); s != nil {
		return nodeapi.SnapshotToWire(s), nil
	}
	return nil, notFound("looking up snapshot %q: not found", req.IdOrName)
}

// DeleteSnapshot implements nodeapi.Node.
func (n *Fake) DeleteSnapshot(ctx context.Context, req *nodev1.DeleteSnapshotRequest) (*nodev1.DeleteSnapshotResponse, error) {
	n.store.mu.Lock()
	defer n.store.mu.Unlock()
	if _, ok := n.store.snaps[req.Id]; !ok {
		return nil, notFound("deleting snapshot %q: not found", req.Id)
	}
	delete(n.store.snaps, req.Id)
	return &nodev1.DeleteSnapshotResponse{}, nil
}

// Events implements nodeapi.Node.
func (n *Fake) Events(ctx context.Context, fn func(*nodev1.Event)) error {
	fn(&nodev1.Event{Kind: nodev1.Event_KIND_SYNC})
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev := <-n.events:
			fn(ev)
		}
	}
}

// Logs implements nodeapi.Node.
func (n *Fake) Logs(ctx context.Context, req *nodev1.LogsRequest) (*nodev1.LogsResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.running[req.SandboxId]; !ok {
		return nil, notFound("reading the log of sandbox %s: not found", req.SandboxId)
	}
	return &nodev1.LogsResponse{Entries: []*nodev1.LogEntry{{Timestamp: timestamppb.Now(), Level: "info", Message: "sandbox created"}}}, nil
}

// Metrics implements nodeapi.Node.
func (n *Fake) Metrics(ctx context.Context, req *nodev1.MetricsRequest) (*nodev1.MetricsResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb, ok := n.running[req.SandboxId]
	if !ok {
		return nil, notFound("reading the metrics of sandbox %s: not found", req.SandboxId)
	}
	return &nodev1.MetricsResponse{Samples: []*nodev1.MetricSample{{Timestamp: timestamppb.Now(),
		CpuCount: sb.wire.CpuCount, MemTotal: uint64(sb.wire.MemoryMb) << 20}}}, nil
}

// CreateVolume implements nodeapi.Node.
func (n *Fake) CreateVolume(ctx context.Context, req *nodev1.CreateVolumeRequest) (*nodev1.CreateVolumeResponse, error) {
	if !ids.Valid(req.VolumeId) {
		return nil, invalid("creating volume %q: invalid id", req.VolumeId)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.volumes[req.VolumeId] = req.SizeBytes
	return &nodev1.CreateVolumeResponse{SizeBytes: req.SizeBytes}, nil
}

// DeleteVolume implements nodeapi.Node.
func (n *Fake) DeleteVolume(ctx context.Context, req *nodev1.DeleteVolumeRequest) (*nodev1.DeleteVolumeResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.volumes[req.VolumeId]; !ok {
		return nil, notFound("deleting volume %s: not found", req.VolumeId)
	}
	delete(n.volumes, req.VolumeId)
	return &nodev1.DeleteVolumeResponse{}, nil
}

// UpdateNetwork implements nodeapi.Node.
func (n *Fake) UpdateNetwork(ctx context.Context, req *nodev1.UpdateNetworkRequest) (*nodev1.UpdateNetworkResponse, error) {
	if _, err := nodeapi.ParseEgressRules(req.AllowOut, req.DenyOut); err != nil {
		return nil, invalid("updating the network of sandbox %s: %w", req.SandboxId, err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.running[req.SandboxId]; !ok {
		return nil, notFound("updating the network of sandbox %s: not found", req.SandboxId)
	}
	return &nodev1.UpdateNetworkResponse{}, nil
}

// ExportVolume implements nodeapi.Node: the fake has no store to move
// volumes through, and pretends the move went well.
func (n *Fake) ExportVolume(ctx context.Context, req *nodev1.ExportVolumeRequest) (*nodev1.ExportVolumeResponse, error) {
	return &nodev1.ExportVolumeResponse{}, nil
}

// ImportVolume implements nodeapi.Node.
func (n *Fake) ImportVolume(ctx context.Context, req *nodev1.ImportVolumeRequest) (*nodev1.ImportVolumeResponse, error) {
	return &nodev1.ImportVolumeResponse{}, nil
}

// PutBuildContext is Unimplemented: the fake builds nothing.
func (n *Fake) PutBuildContext(context.Context, *nodev1.PutBuildContextRequest) (*nodev1.PutBuildContextResponse, error) {
	return nil, unimplemented("PutBuildContext")
}

// Build is Unimplemented: the fake builds nothing.
func (n *Fake) Build(context.Context, *nodev1.BuildRequest, func(*nodev1.BuildEvent)) error {
	return unimplemented("Build")
}

// Pull is Unimplemented: the fake pulls nothing.
func (n *Fake) Pull(context.Context, *nodev1.PullRequest, func(*nodev1.PullEvent)) error {
	return unimplemented("Pull")
}

// fakeChunk is the size of the fake's export chunks: small, so that a
// snapshot takes several and a cut can fall between them.
const fakeChunk = 64

// fakeSnapshotFile is the one file a fake snapshot is exported as: its
// description.
const fakeSnapshotFile = "snapshot/meta.json"

// CutExport makes the node's next ExportSnapshot stream break after
// chunks chunks (as a connection that drops), once.
func (n *Fake) CutExport(chunks int) {
	n.mu.Lock()
	n.cutAfter = chunks
	n.mu.Unlock()
}

// Exports counts the ExportSnapshot calls the node answered.
func (n *Fake) Exports() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exports
}

// AddTemplate makes the node hold template id (as one a build made on it).
func (n *Fake) AddTemplate(id string) {
	n.mu.Lock()
	n.templates[id] = true
	n.mu.Unlock()
}

// HasTemplate says whether the node holds template id.
func (n *Fake) HasTemplate(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return id == FakeTemplate || n.templates[id]
}

// ExportSnapshot implements nodeapi.Node: a snapshot travels as its
// description (JSON), and its template, when asked, as its id.
func (n *Fake) ExportSnapshot(ctx context.Context, req *nodev1.ExportSnapshotRequest, fn func(*nodev1.SnapshotPart) error) error {
	s := n.store.get(req.SnapshotId)
	if s == nil {
		return notFound("exporting snapshot %q: not found", req.SnapshotId)
	}
	n.mu.Lock()
	n.exports++
	cut := n.cutAfter
	n.cutAfter = 0
	n.mu.Unlock()
	meta, err := json.Marshal(s)
	if err != nil {
		return err
	}
	files := map[string][]byte{fakeSnapshotFile: meta}
	if req.Template {
		files["template/"+s.TemplateID] = []byte(s.TemplateID)
	}
	sent := 0
	for _, name := range slices.Sorted(maps.Keys(files)) {
		data := files[name]
		off := min(req.Offsets[name], int64(len(data)))
		for pos := off; pos < int64(len(data)); pos += fakeChunk {
			if cut > 0 && sent == cut {
				return nodeapi.NewError(connect.CodeUnavailable, fmt.Errorf("exporting snapshot %s: the connection dropped", s.ID))
			}
			if err := fn(&nodev1.SnapshotPart{File: name, Offset: pos, Data: data[pos:min(pos+fakeChunk, int64(len(data)))]}); err != nil {
				return err
			}
			sent++
		}
		sum := sha256.Sum256(data)
		if err := fn(&nodev1.SnapshotPart{Done: &nodev1.TransferFile{Name: name, Size: int64(len(data)), Sha256: hex.EncodeToString(sum[:])}}); err != nil {
			return err
		}
	}
	return fn(&nodev1.SnapshotPart{Last: true})
}

// ImportSnapshot implements nodeapi.Node over ExportSnapshot's files.
func (n *Fake) ImportSnapshot(ctx context.Context, req *nodev1.ImportSnapshotRequest) (*nodev1.ImportSnapshotResponse, error) {
	id := req.SnapshotId
	if !snapshot.ValidID(id) {
		return nil, invalid("importing snapshot %q: invalid id", id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	in := n.incoming[id]
	switch req.Step {
	case nodev1.ImportSnapshotRequest_STEP_BEGIN:
		if n.store.get(id) != nil {
			return &nodev1.ImportSnapshotResponse{Present: true}, nil
		}
		out := &nodev1.ImportSnapshotResponse{Received: map[string]int64{},
			TemplatePresent: req.TemplateId == "" || req.TemplateId == FakeTemplate || n.templates[req.TemplateId]}
		for name, data := range in {
			out.Received[name] = int64(len(data))
		}
		return out, nil
	case nodev1.ImportSnapshotRequest_STEP_CHUNK:
		if !transfer.ValidName(req.File) {
			return nil, invalid("importing snapshot %s: bad file name %q", id, req.File)
		}
		if in == nil {
			in = map[string][]byte{}
			n.incoming[id] = in
		}
		if int64(len(in[req.File])) != req.Offset {
			return nil, invalid("importing snapshot %s: a chunk of %s at %d, and %d bytes are here", id, req.File, req.Offset, len(in[req.File]))
		}
		in[req.File] = append(in[req.File], req.Data...)
	case nodev1.ImportSnapshotRequest_STEP_COMMIT:
		// As transfer.Receiver: a file short of its size is kept for the
		// rest to follow; one that does not match is dropped.
		var short []string
		for _, f := range req.Files {
			sum := sha256.Sum256(in[f.Name])
			switch got := int64(len(in[f.Name])); {
			case got < f.Size:
				short = append(short, f.Name)
			case got != f.Size || hex.EncodeToString(sum[:]) != f.Sha256:
				delete(in, f.Name)
				return nil, nodeapi.NewError(connect.CodeUnavailable, fmt.Errorf("importing snapshot %s: %s does not match", id, f.Name))
			}
		}
		if len(short) > 0 {
			return nil, nodeapi.NewError(connect.CodeUnavailable, fmt.Errorf("importing snapshot %s: %s not received whole", id, strings.Join(short, ", ")))
		}
		var s snapshot.Snapshot
		if err := json.Unmarshal(in[fakeSnapshotFile], &s); err != nil || s.ID != id {
			return nil, invalid("importing snapshot %s: its description: %v", id, err)
		}
		for name := range in {
			if tpl, ok := strings.CutPrefix(name, "template/"); ok {
				n.templates[tpl] = true
			}
		}
		n.store.put(&s)
		delete(n.incoming, id)
	case nodev1.ImportSnapshotRequest_STEP_ABORT:
		delete(n.incoming, id)
	default:
		return nil, invalid("importing snapshot %s: unknown step %v", id, req.Step)
	}
	return &nodev1.ImportSnapshotResponse{}, nil
}
