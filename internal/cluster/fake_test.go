package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// fakeNode stands in for the node API in these unit tests of the
// cluster's own rules (records, reconciling, deadlines, placement); the
// real node, in-process and remote, is driven end to end by the server
// tests. It answers with the node API's error classes, as both real
// implementations do.
type fakeNode struct {
	id string
	// memoryMB is its capacity; full makes it refuse creates as a node
	// whose admission says no.
	memoryMB int
	full     bool
	// delay is how long a create takes (starts that overlap in time).
	delay time.Duration
	// lists counts List calls: a server that subscribed to the node's
	// events reconciles with it (the first event is a sync) by listing.
	lists atomic.Int32

	mu      sync.Mutex
	running map[string]*nodev1.Sandbox
	killed  []string
	seq     int
	events  chan *nodev1.Event
	// store holds the snapshots; nodes made by newFakeNodes share one, as
	// nodes with a snapshot store do.
	store *fakeStore
}

type fakeStore struct {
	mu    sync.Mutex
	snaps map[string]*snapshot.Snapshot
}

func (s *fakeStore) get(id string) *snapshot.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snaps[id]
}

func (s *fakeStore) put(snap *snapshot.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snaps[snap.ID] = snap
}

func (s *fakeStore) list() []*snapshot.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*snapshot.Snapshot
	for _, snap := range s.snaps {
		out = append(out, snap)
	}
	return out
}

func newFakeNode(id string) *fakeNode {
	return &fakeNode{id: id, memoryMB: 4096, running: map[string]*nodev1.Sandbox{},
		store: &fakeStore{snaps: map[string]*snapshot.Snapshot{}}, events: make(chan *nodev1.Event, 16)}
}

// newFakeNodes makes nodes that share one snapshot store.
func newFakeNodes(ids ...string) []*fakeNode {
	var out []*fakeNode
	for _, id := range ids {
		n := newFakeNode(id)
		if len(out) > 0 {
			n.store = out[0].store
		}
		out = append(out, n)
	}
	return out
}

func (n *fakeNode) ID() string { return n.id }

func (n *fakeNode) Info(context.Context, *nodev1.InfoRequest) (*nodev1.NodeInfo, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return &nodev1.NodeInfo{Id: n.id, Capacity: &nodev1.Resources{CpuCount: 2, MemoryMb: int32(n.memoryMB)},
		Usage: &nodev1.Resources{CommittedMemoryMb: int32(512 * len(n.running))}, Runtime: "fake",
		Sandboxes: int32(len(n.running)), Templates: []string{"base"}}, nil
}

func (n *fakeNode) Create(ctx context.Context, req *nodev1.CreateRequest) (*nodev1.Sandbox, error) {
	time.Sleep(n.delay)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.full {
		return nil, fmt.Errorf("%w: node %s is full", nodeapi.ErrResourceExhausted, n.id)
	}
	id := req.SandboxId
	if id == "" {
		n.seq++
		id = fmt.Sprintf("%s-sb%d", n.id, n.seq)
	}
	// The source says which it is; the fake, as the node, never guesses.
	if snapID := req.GetSnapshotId(); snapID != "" {
		snap := n.store.get(snapID)
		if snap == nil {
			return nil, fmt.Errorf("%w: snapshot %q not found", nodeapi.ErrNotFound, snapID)
		}
		if snap.Kind == snapshot.KindPause && snap.SandboxID != id {
			return nil, fmt.Errorf("%w: pause snapshot of another sandbox", nodeapi.ErrInvalid)
		}
	} else if req.GetTemplateId() != "base" {
		return nil, fmt.Errorf("%w: template %q not found", nodeapi.ErrNotFound, req.GetTemplateId())
	}
	sb := &nodev1.Sandbox{Id: id, TemplateId: "base", CpuCount: 2, MemoryMb: 512,
		StartedAt: timestamppb.New(time.Now()), Addr: "10.0.0.1"}
	n.running[id] = sb
	return sb, nil
}

func (n *fakeNode) Kill(ctx context.Context, req *nodev1.KillRequest) (*nodev1.KillResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.killed = append(n.killed, req.SandboxId)
	if _, ok := n.running[req.SandboxId]; !ok {
		return nil, fmt.Errorf("%w: sandbox not found", nodeapi.ErrNotFound)
	}
	delete(n.running, req.SandboxId)
	return &nodev1.KillResponse{}, nil
}

func (n *fakeNode) List(context.Context, *nodev1.ListRequest) (*nodev1.ListResponse, error) {
	n.lists.Add(1)
	n.mu.Lock()
	defer n.mu.Unlock()
	out := &nodev1.ListResponse{}
	for _, sb := range n.running {
		out.Sandboxes = append(out.Sandboxes, sb)
	}
	return out, nil
}

func (n *fakeNode) Snapshot(ctx context.Context, req *nodev1.SnapshotRequest) (*nodev1.SnapshotInfo, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.running[req.SandboxId]; !ok {
		return nil, fmt.Errorf("%w: sandbox not found", nodeapi.ErrNotFound)
	}
	n.seq++
	s := &snapshot.Snapshot{ID: fmt.Sprintf("snap%d", n.seq), Kind: snapshot.Kind(req.Kind), SandboxID: req.SandboxId,
		CreatedAt: time.Now(), Runtime: "fake"}
	n.store.put(s)
	if req.Stop {
		delete(n.running, req.SandboxId)
	}
	return snapshotWire(s), nil
}

func snapshotWire(s *snapshot.Snapshot) *nodev1.SnapshotInfo {
	return &nodev1.SnapshotInfo{Id: s.ID, Kind: string(s.Kind), SandboxId: s.SandboxID,
		CreatedAt: timestamppb.New(s.CreatedAt), Runtime: s.Runtime}
}

func (n *fakeNode) Stats(context.Context, *nodev1.StatsRequest) (*nodev1.SandboxStats, error) {
	return &nodev1.SandboxStats{Since: timestamppb.Now()}, nil
}

func (n *fakeNode) ListSnapshots(ctx context.Context, req *nodev1.ListSnapshotsRequest) (*nodev1.ListSnapshotsResponse, error) {
	out := &nodev1.ListSnapshotsResponse{}
	for _, s := range n.store.list() {
		for _, k := range req.Kinds {
			if string(s.Kind) == k {
				out.Snapshots = append(out.Snapshots, snapshotWire(s))
			}
		}
		if len(req.Kinds) == 0 {
			out.Snapshots = append(out.Snapshots, snapshotWire(s))
		}
	}
	return out, nil
}

func (n *fakeNode) GetSnapshot(ctx context.Context, req *nodev1.GetSnapshotRequest) (*nodev1.SnapshotInfo, error) {
	if s := n.store.get(req.IdOrName); s != nil {
		return snapshotWire(s), nil
	}
	return nil, fmt.Errorf("%w: snapshot not found", nodeapi.ErrNotFound)
}

func (n *fakeNode) DeleteSnapshot(ctx context.Context, req *nodev1.DeleteSnapshotRequest) (*nodev1.DeleteSnapshotResponse, error) {
	n.store.mu.Lock()
	defer n.store.mu.Unlock()
	delete(n.store.snaps, req.Id)
	return &nodev1.DeleteSnapshotResponse{}, nil
}

func (n *fakeNode) Events(ctx context.Context, fn func(*nodev1.Event)) error {
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

// exit makes sandbox id die on its own, as the node reports it.
func (n *fakeNode) exit(id, reason string) {
	n.mu.Lock()
	delete(n.running, id)
	n.mu.Unlock()
	n.events <- &nodev1.Event{Kind: nodev1.Event_KIND_EXITED, SandboxId: id, Reason: reason}
}

func (n *fakeNode) isRunning(id string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	_, ok := n.running[id]
	return ok
}

func (n *fakeNode) Logs(ctx context.Context, req *nodev1.LogsRequest) (*nodev1.LogsResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.running[req.SandboxId]; !ok {
		return nil, fmt.Errorf("%w: sandbox not found", nodeapi.ErrNotFound)
	}
	return &nodev1.LogsResponse{Entries: []*nodev1.LogEntry{{Timestamp: timestamppb.Now(), Level: "info", Message: "sandbox created"}}}, nil
}

func (n *fakeNode) Metrics(ctx context.Context, req *nodev1.MetricsRequest) (*nodev1.MetricsResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.running[req.SandboxId]; !ok {
		return nil, fmt.Errorf("%w: sandbox not found", nodeapi.ErrNotFound)
	}
	return &nodev1.MetricsResponse{Samples: []*nodev1.MetricSample{{Timestamp: timestamppb.Now(), CpuCount: 2, MemTotal: 512 << 20}}}, nil
}

func (n *fakeNode) CreateVolume(ctx context.Context, req *nodev1.CreateVolumeRequest) (*nodev1.CreateVolumeResponse, error) {
	return &nodev1.CreateVolumeResponse{SizeBytes: req.SizeBytes}, nil
}

func (n *fakeNode) DeleteVolume(ctx context.Context, req *nodev1.DeleteVolumeRequest) (*nodev1.DeleteVolumeResponse, error) {
	return &nodev1.DeleteVolumeResponse{}, nil
}

func (n *fakeNode) UpdateNetwork(ctx context.Context, req *nodev1.UpdateNetworkRequest) (*nodev1.UpdateNetworkResponse, error) {
	return &nodev1.UpdateNetworkResponse{}, nil
}

func (n *fakeNode) ExportVolume(ctx context.Context, req *nodev1.ExportVolumeRequest) (*nodev1.ExportVolumeResponse, error) {
	return &nodev1.ExportVolumeResponse{}, nil
}

func (n *fakeNode) ImportVolume(ctx context.Context, req *nodev1.ImportVolumeRequest) (*nodev1.ImportVolumeResponse, error) {
	return &nodev1.ImportVolumeResponse{}, nil
}
