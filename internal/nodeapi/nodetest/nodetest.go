// Package nodetest is the conformance suite of the node API
// (nodeapi.Node): what the control plane relies on of a node, run against
// every implementation (the node in this process, nodeserver.Local; the
// wire, nodeapi.Remote, in front of it; and Fake, the node the cluster's
// unit tests run over), so that what a cluster test learns on the fake
// holds on a real node. Only tests import it.
package nodetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/aenvhq/aenv/internal/ids"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/snapshot"
)

// Options state what the node under test holds and can do. A part of the
// contract a node cannot do is a field the caller sets, never a skip:
// such a node must then refuse it with the code the contract names.
type Options struct {
	// Template is a template the node holds whose sandboxes start within
	// seconds.
	Template string
	// Snapshots: the node saves sandboxes and starts sandboxes from what
	// it saved. Without, Snapshot answers Unimplemented.
	Snapshots bool
	// Volumes: the node holds volumes and mounts them into sandboxes.
	// Without, CreateVolume answers Unimplemented.
	Volumes bool
	// Crash makes sandbox id end on its own (a crash, an OOM kill), as
	// the node's runtime notices it. Required.
	Crash func(t *testing.T, id string)
	// Getenv is the value of environment variable name in sandbox sb as
	// its processes see it. Required.
	Getenv func(t *testing.T, sb *nodev1.Sandbox, name string) string
}

// wait bounds what the suite waits for that should happen soon (an exit
// noticed, an event delivered).
const wait = 15 * time.Second

// Run runs the suite against n, one subtest after the other: a real node
// is too costly to start for each. Every subtest removes the sandboxes,
// snapshots and volumes it made; n must hold none of the suite's ids.
func Run(t *testing.T, n nodeapi.Node, opts Options) {
	if opts.Template == "" || opts.Crash == nil || opts.Getenv == nil {
		t.Fatal("nodetest.Options: Template, Crash and Getenv are required")
	}
	s := &suite{n: n, opts: opts}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"Info", s.testInfo},
		{"Create", s.testCreate},
		{"CreateErrors", s.testCreateErrors},
		{"Kill", s.testKill},
		{"UnknownSandbox", s.testUnknownSandbox},
		{"UpdateNetwork", s.testUpdateNetwork},
		{"Snapshots", s.testSnapshots},
		{"SnapshotTransfer", s.testSnapshotTransfer},
		{"Volumes", s.testVolumes},
		{"Events", s.testEvents},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	n    nodeapi.Node
	opts Options
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// wantCode fails t unless err is a node API error of code.
func wantCode(t *testing.T, what string, err error, code connect.Code) {
	t.Helper()
	if got := nodeapi.Code(err); err == nil || got != code {
		t.Fatalf("%s: error %v (code %v), want code %v", what, err, got, code)
	}
}

// create creates a sandbox of req (the suite's template unless named),
// killed when t ends if it still runs.
func (s *suite) create(t *testing.T, req *nodev1.CreateRequest) *nodev1.Sandbox {
	t.Helper()
	if req.Source == nil {
		req.Source = fromTemplate(s.opts.Template)
	}
	sb, err := s.n.Create(ctxT(t), req)
	if err != nil {
		t.Fatalf("creating a sandbox of %s%s: %v", req.GetTemplateId(), req.GetSnapshotId(), err)
	}
	s.cleanupKill(t, sb.Id)
	return sb
}

func (s *suite) cleanupKill(t *testing.T, id string) {
	t.Cleanup(func() {
		_, err := s.n.Kill(context.Background(), &nodev1.KillRequest{SandboxId: id})
		if err != nil && nodeapi.Code(err) != connect.CodeNotFound {
			t.Errorf("killing sandbox %s at the end: %v", id, err)
		}
	})
}

// listed is the node's record of sandbox id, nil if it does not list it.
func (s *suite) listed(t *testing.T, id string) *nodev1.Sandbox {
	t.Helper()
	l, err := s.n.List(ctxT(t), &nodev1.ListRequest{})
	if err != nil {
		t.Fatalf("listing: %v", err)
	}
	for _, sb := range l.Sandboxes {
		if sb.Id == id {
			return sb
		}
	}
	return nil
}

// listedUsage is the last sample of sandbox id a List with usage
// reports, nil if none.
func (s *suite) listedUsage(t *testing.T, id string) *nodev1.MetricSample {
	t.Helper()
	l, err := s.n.List(ctxT(t), &nodev1.ListRequest{Usage: true})
	if err != nil {
		t.Fatalf("listing with usage: %v", err)
	}
	for _, sb := range l.Sandboxes {
		if sb.Id == id {
			return sb.Usage
		}
	}
	return nil
}

func (s *suite) testInfo(t *testing.T) {
	info, err := s.n.Info(ctxT(t), &nodev1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Id != s.n.ID() {
		t.Errorf("Info names node %q, ID() %q", info.Id, s.n.ID())
	}
	if info.Capacity.GetCpuCount() <= 0 || info.Capacity.GetMemoryMb() <= 0 {
		t.Errorf("capacity %v: want CPUs and memory", info.Capacity)
	}
	if info.Runtime == "" {
		t.Error("Info names no runtime")
	}
	if !slices.Contains(info.Templates, s.opts.Template) {
		t.Errorf("templates %v lack %s", info.Templates, s.opts.Template)
	}
}

// testCreate: a sandbox comes up with the id, resources, environment and
// token asked for, and the node lists it, reads its stats and keeps its
// log; the sandbox count and committed memory include it.
func (s *suite) testCreate(t *testing.T) {
	ctx := ctxT(t)
	before, err := s.n.Info(ctx, &nodev1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := ids.New()
	sb := s.create(t, &nodev1.CreateRequest{SandboxId: id, CpuCount: 1, MemoryMb: 256, Secure: true,
		EnvVars: map[string]string{"NODETEST_VAR": "value-" + id}})
	if sb.Id != id || sb.CpuCount != 1 || sb.MemoryMb != 256 {
		t.Errorf("created %s with %d CPUs and %d MiB, want %s with 1 and 256", sb.Id, sb.CpuCount, sb.MemoryMb, id)
	}
	if sb.EnvdAccessToken == "" || sb.Addr == "" || sb.EnvdVersion == "" || sb.TemplateId == "" {
		t.Errorf("created %+v: want a token, an address, envd's version and the template", sb)
	}
	if age := time.Since(sb.StartedAt.AsTime()); age < 0 || age > time.Minute {
		t.Errorf("started at %v, %v ago", sb.StartedAt.AsTime(), age)
	}
	if got := s.opts.Getenv(t, sb, "NODETEST_VAR"); got != "value-"+id {
		t.Errorf("NODETEST_VAR in the sandbox is %q, want %q", got, "value-"+id)
	}
	l := s.listed(t, id)
	if l == nil {
		t.Fatalf("sandbox %s not listed", id)
	}
	if l.CpuCount != sb.CpuCount || l.MemoryMb != sb.MemoryMb || l.EnvdAccessToken != sb.EnvdAccessToken || l.Addr != sb.Addr || l.TemplateId != sb.TemplateId {
		t.Errorf("listed as %+v, created as %+v", l, sb)
	}
	if l.Usage != nil {
		t.Errorf("a list that did not ask for usage carries it: %v", l.Usage)
	}
	// Its first sample is taken as it starts.
	if u := s.listedUsage(t, id); u == nil || u.CpuCount != 1 || u.MemTotal != 256<<20 || u.MemUsed == 0 || u.Timestamp == nil {
		t.Errorf("its usage as a list with usage has it: %v; want a sample of 1 CPU and 256 MiB, some used", u)
	}
	plain := s.create(t, &nodev1.CreateRequest{})
	if plain.Id == "" || plain.Id == id || plain.EnvdAccessToken != "" {
		t.Errorf("a create without id or secure: %+v; want an id of its own and no token", plain)
	}
	after, err := s.n.Info(ctx, &nodev1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.Sandboxes < before.Sandboxes+2 || after.Usage.GetCommittedMemoryMb() < before.Usage.GetCommittedMemoryMb()+256 ||
		after.Usage.GetCpuCount() < before.Usage.GetCpuCount()+1 {
		t.Errorf("Info before two creates: %d sandboxes, %d MiB and %d CPUs committed; after: %d, %d, %d", before.Sandboxes,
			before.Usage.GetCommittedMemoryMb(), before.Usage.GetCpuCount(), after.Sandboxes, after.Usage.GetCommittedMemoryMb(), after.Usage.GetCpuCount())
	}
	st, err := s.n.Stats(ctx, &nodev1.StatsRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("stats: %v", err)
	}
	if st.Since == nil || st.Since.AsTime().IsZero() {
		t.Errorf("stats %+v: want the time they count from", st)
	}
	logs, err := s.n.Logs(ctx, &nodev1.LogsRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("logs: %v", err)
	}
	if len(logs.Entries) == 0 {
		t.Error("a created sandbox has no log entries")
	}
	if _, err := s.n.Metrics(ctx, &nodev1.MetricsRequest{SandboxId: id}); err != nil {
		t.Errorf("metrics: %v", err)
	}
}

// testCreateErrors: each refusal has its code, and leaves nothing behind.
func (s *suite) testCreateErrors(t *testing.T) {
	ctx := ctxT(t)
	sb := s.create(t, &nodev1.CreateRequest{SandboxId: ids.New()})
	_, err := s.n.Create(ctx, &nodev1.CreateRequest{SandboxId: sb.Id, Source: fromTemplate(s.opts.Template)})
	wantCode(t, "a create of a taken id", err, connect.CodeAlreadyExists)
	if l := s.listed(t, sb.Id); l == nil || l.Addr != sb.Addr {
		t.Errorf("after a create of its id, the first sandbox is listed as %+v, want %+v", l, sb)
	}

	info, err := s.n.Info(ctx, &nodev1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		what string
		req  *nodev1.CreateRequest
		code connect.Code
	}{
		{"an unknown template", &nodev1.CreateRequest{Source: fromTemplate("nodetest-no-such-template")}, connect.CodeNotFound},
		{"an allowOut rule that is none", &nodev1.CreateRequest{AllowOut: []string{"not a rule!"}}, connect.CodeInvalidArgument},
		{"a denyOut rule that is a domain", &nodev1.CreateRequest{DenyOut: []string{"example.com"}}, connect.CodeInvalidArgument},
		{"more memory than the node has", &nodev1.CreateRequest{MemoryMb: info.Capacity.MemoryMb + 1}, connect.CodeInvalidArgument},
	}
	if s.opts.Volumes {
		cases = append(cases, struct {
			what string
			req  *nodev1.CreateRequest
			code connect.Code
		}{"a mount of an unknown volume", &nodev1.CreateRequest{Mounts: []*nodev1.VolumeMount{{VolumeId: ids.New(), Path: "/data"}}}, connect.CodeNotFound})
	}
	// A malformed id never reaches the node's files or its runtime.
	for _, bad := range []string{"../escape", "UPPER", strings.Repeat("a", ids.MaxLen+1)} {
		_, err := s.n.Create(ctx, &nodev1.CreateRequest{SandboxId: bad, Source: fromTemplate(s.opts.Template)})
		if err == nil {
			s.cleanupKill(t, bad)
		}
		wantCode(t, fmt.Sprintf("a create with the malformed id %.20q", bad), err, connect.CodeInvalidArgument)
	}
	for _, tc := range cases {
		id := ids.New()
		tc.req.SandboxId = id
		if tc.req.Source == nil {
			tc.req.Source = fromTemplate(s.opts.Template)
		}
		_, err := s.n.Create(ctx, tc.req)
		if err == nil {
			s.cleanupKill(t, id)
		}
		wantCode(t, "a create with "+tc.what, err, tc.code)
		if s.listed(t, id) != nil {
			t.Errorf("a refused create (%s) left sandbox %s listed", tc.what, id)
		}
		// The id is free again: the refusal held nothing of it.
		again := s.create(t, &nodev1.CreateRequest{SandboxId: id})
		if again.Id != id {
			t.Errorf("created %s, want %s", again.Id, id)
		}
		s.kill(t, id)
	}
}

func (s *suite) kill(t *testing.T, id string) {
	t.Helper()
	if _, err := s.n.Kill(ctxT(t), &nodev1.KillRequest{SandboxId: id}); err != nil {
		t.Fatalf("killing %s: %v", id, err)
	}
}

// testKill: a killed sandbox is gone from the list, and its id can be
// used again.
func (s *suite) testKill(t *testing.T) {
	ctx := ctxT(t)
	sb := s.create(t, &nodev1.CreateRequest{SandboxId: ids.New()})
	s.kill(t, sb.Id)
	if s.listed(t, sb.Id) != nil {
		t.Errorf("killed sandbox %s still listed", sb.Id)
	}
	_, err := s.n.Kill(ctx, &nodev1.KillRequest{SandboxId: sb.Id})
	wantCode(t, "a second kill", err, connect.CodeNotFound)
	_, err = s.n.Stats(ctx, &nodev1.StatsRequest{SandboxId: sb.Id})
	wantCode(t, "the stats of a killed sandbox", err, connect.CodeNotFound)
	again := s.create(t, &nodev1.CreateRequest{SandboxId: sb.Id})
	if s.listed(t, again.Id) == nil {
		t.Errorf("sandbox %s, created again, not listed", again.Id)
	}
}

// testUnknownSandbox: every call about a sandbox the node never ran is
// NotFound.
func (s *suite) testUnknownSandbox(t *testing.T) {
	ctx := ctxT(t)
	id := ids.New()
	_, err := s.n.Kill(ctx, &nodev1.KillRequest{SandboxId: id})
	wantCode(t, "Kill", err, connect.CodeNotFound)
	_, err = s.n.Stats(ctx, &nodev1.StatsRequest{SandboxId: id})
	wantCode(t, "Stats", err, connect.CodeNotFound)
	_, err = s.n.Logs(ctx, &nodev1.LogsRequest{SandboxId: id})
	wantCode(t, "Logs", err, connect.CodeNotFound)
	_, err = s.n.Metrics(ctx, &nodev1.MetricsRequest{SandboxId: id})
	wantCode(t, "Metrics", err, connect.CodeNotFound)
	_, err = s.n.UpdateNetwork(ctx, &nodev1.UpdateNetworkRequest{SandboxId: id, AllowInternet: true})
	wantCode(t, "UpdateNetwork", err, connect.CodeNotFound)
	if s.opts.Snapshots {
		_, err = s.n.Snapshot(ctx, &nodev1.SnapshotRequest{SandboxId: id, Kind: string(snapshot.KindSnapshot)})
		wantCode(t, "Snapshot", err, connect.CodeNotFound)
	}
	_, err = s.n.GetSnapshot(ctx, &nodev1.GetSnapshotRequest{IdOrName: id})
	wantCode(t, "GetSnapshot", err, connect.CodeNotFound)
	_, err = s.n.DeleteSnapshot(ctx, &nodev1.DeleteSnapshotRequest{Id: id})
	wantCode(t, "DeleteSnapshot", err, connect.CodeNotFound)
	_, err = s.n.DeleteVolume(ctx, &nodev1.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, "DeleteVolume", err, connect.CodeNotFound)
}

func (s *suite) testUpdateNetwork(t *testing.T) {
	ctx := ctxT(t)
	sb := s.create(t, &nodev1.CreateRequest{SandboxId: ids.New()})
	if _, err := s.n.UpdateNetwork(ctx, &nodev1.UpdateNetworkRequest{SandboxId: sb.Id, AllowInternet: false,
		AllowOut: []string{"10.1.2.0/24", "example.com"}, DenyOut: []string{"0.0.0.0/0"}}); err != nil {
		t.Fatalf("updating the network: %v", err)
	}
	_, err := s.n.UpdateNetwork(ctx, &nodev1.UpdateNetworkRequest{SandboxId: sb.Id, DenyOut: []string{"*.example.com"}})
	wantCode(t, "a denyOut rule that is a domain", err, connect.CodeInvalidArgument)
	if s.listed(t, sb.Id) == nil {
		t.Errorf("sandbox %s not listed after its network changed", sb.Id)
	}
}

// testSnapshots: a snapshot is found by id and by kind and starts a new
// sandbox; a pause ends the sandbox and a create of its id from the
// pause brings it back; a deleted snapshot is gone.
func (s *suite) testSnapshots(t *testing.T) {
	ctx := ctxT(t)
	sb := s.create(t, &nodev1.CreateRequest{SandboxId: ids.New(), Secure: true,
		EnvVars: map[string]string{"NODETEST_VAR": "saved"}})
	if !s.opts.Snapshots {
		_, err := s.n.Snapshot(ctx, &nodev1.SnapshotRequest{SandboxId: sb.Id, Kind: string(snapshot.KindSnapshot)})
		wantCode(t, "a snapshot on a node without snapshots", err, connect.CodeUnimplemented)
		return
	}
	_, err := s.n.Snapshot(ctx, &nodev1.SnapshotRequest{SandboxId: sb.Id, Kind: "nodetest-no-such-kind"})
	wantCode(t, "a snapshot of an unknown kind", err, connect.CodeInvalidArgument)

	snap, err := s.n.Snapshot(ctx, &nodev1.SnapshotRequest{SandboxId: sb.Id, Kind: string(snapshot.KindSnapshot)})
	if err != nil {
		t.Fatalf("snapshotting: %v", err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			s.n.DeleteSnapshot(context.Background(), &nodev1.DeleteSnapshotRequest{Id: snap.Id})
		}
	})
	if snap.Id == "" || snap.SandboxId != sb.Id || snap.Kind != string(snapshot.KindSnapshot) || snap.CreatedAt == nil {
		t.Errorf("snapshot %+v: want an id, sandbox %s and kind snapshot", snap, sb.Id)
	}
	if s.listed(t, sb.Id) == nil {
		t.Errorf("sandbox %s not listed after a snapshot without stop", sb.Id)
	}
	got, err := s.n.GetSnapshot(ctx, &nodev1.GetSnapshotRequest{IdOrName: snap.Id})
	if err != nil || got.Id != snap.Id || got.SandboxId != sb.Id {
		t.Errorf("GetSnapshot(%s) = %+v, %v", snap.Id, got, err)
	}
	if !s.snapshotListed(t, snap.Id, snapshot.KindSnapshot) || s.snapshotListed(t, snap.Id, snapshot.KindPause) {
		t.Errorf("snapshot %s: want it listed among snapshots and not among pauses", snap.Id)
	}
	child := s.create(t, &nodev1.CreateRequest{Source: fromSnapshot(snap.Id)})
	if child.Id == sb.Id || child.MemoryMb != sb.MemoryMb || child.EnvdAccessToken == "" || child.EnvdAccessToken == sb.EnvdAccessToken {
		t.Errorf("a sandbox from snapshot %s: %+v; want its own id and token, %d MiB", snap.Id, child, sb.MemoryMb)
	}
	if s.listed(t, sb.Id) == nil || s.listed(t, child.Id) == nil {
		t.Errorf("want both the saved sandbox and the one started from it listed")
	}
	if _, err := s.n.DeleteSnapshot(ctx, &nodev1.DeleteSnapshotRequest{Id: snap.Id}); err != nil {
		t.Fatalf("deleting snapshot %s: %v", snap.Id, err)
	}
	deleted = true
	_, err = s.n.GetSnapshot(ctx, &nodev1.GetSnapshotRequest{IdOrName: snap.Id})
	wantCode(t, "a deleted snapshot", err, connect.CodeNotFound)
	_, err = s.n.Create(ctx, &nodev1.CreateRequest{Source: fromSnapshot(snap.Id)})
	wantCode(t, "a create from a deleted snapshot", err, connect.CodeNotFound)

	pause, err := s.n.Snapshot(ctx, &nodev1.SnapshotRequest{SandboxId: sb.Id, Kind: string(snapshot.KindPause), Stop: true})
	if err != nil {
		t.Fatalf("pausing: %v", err)
	}
	t.Cleanup(func() { s.n.DeleteSnapshot(context.Background(), &nodev1.DeleteSnapshotRequest{Id: pause.Id}) })
	if s.listed(t, sb.Id) != nil {
		t.Errorf("paused sandbox %s still listed", sb.Id)
	}
	if !s.snapshotListed(t, pause.Id, snapshot.KindPause) {
		t.Errorf("pause %s not listed among pauses", pause.Id)
	}
	resumed := s.create(t, &nodev1.CreateRequest{SandboxId: sb.Id, Source: fromSnapshot(pause.Id)})
	if resumed.Id != sb.Id || resumed.EnvdAccessToken != sb.EnvdAccessToken {
		t.Errorf("resumed as %+v; want id %s and its token", resumed, sb.Id)
	}
	if got := s.opts.Getenv(t, resumed, "NODETEST_VAR"); got != "saved" {
		t.Errorf("NODETEST_VAR after the resume is %q, want %q", got, "saved")
	}
}

func (s *suite) snapshotListed(t *testing.T, id string, kind snapshot.Kind) bool {
	t.Helper()
	l, err := s.n.ListSnapshots(ctxT(t), &nodev1.ListSnapshotsRequest{Kinds: []string{string(kind)}})
	if err != nil {
		t.Fatalf("listing snapshots: %v", err)
	}
	for _, sn := range l.Snapshots {
		if sn.Kind != string(kind) {
			t.Errorf("listing kind %s gave snapshot %s of kind %s", kind, sn.Id, sn.Kind)
		}
		if sn.Id == id {
			return true
		}
	}
	return false
}

// testVolumes: a volume mounts into a sandbox; a mount at a relative
// path is the caller's mistake; a deleted volume is gone.
func (s *suite) testVolumes(t *testing.T) {
	ctx := ctxT(t)
	vol := ids.New()
	if !s.opts.Volumes {
		_, err := s.n.CreateVolume(ctx, &nodev1.CreateVolumeRequest{VolumeId: vol})
		wantCode(t, "a volume on a node without volumes", err, connect.CodeUnimplemented)
		return
	}
	if _, err := s.n.CreateVolume(ctx, &nodev1.CreateVolumeRequest{VolumeId: vol}); err != nil {
		t.Fatalf("creating volume %s: %v", vol, err)
	}
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			s.n.DeleteVolume(context.Background(), &nodev1.DeleteVolumeRequest{VolumeId: vol})
		}
	})
	id := ids.New()
	_, err := s.n.Create(ctx, &nodev1.CreateRequest{SandboxId: id, Source: fromTemplate(s.opts.Template),
		Mounts: []*nodev1.VolumeMount{{VolumeId: vol, Path: "data"}}})
	if err == nil {
		s.cleanupKill(t, id)
	}
	wantCode(t, "a mount at a relative path", err, connect.CodeInvalidArgument)
	sb := s.create(t, &nodev1.CreateRequest{SandboxId: id, Mounts: []*nodev1.VolumeMount{{VolumeId: vol, Path: "/data"}}})
	s.kill(t, sb.Id)
	if _, err := s.n.DeleteVolume(ctx, &nodev1.DeleteVolumeRequest{VolumeId: vol}); err != nil {
		t.Fatalf("deleting volume %s: %v", vol, err)
	}
	deleted = true
	_, err = s.n.DeleteVolume(ctx, &nodev1.DeleteVolumeRequest{VolumeId: vol})
	wantCode(t, "deleting a deleted volume", err, connect.CodeNotFound)
}

// subscription is one Events stream, read into a channel.
type subscription struct {
	events chan *nodev1.Event
	done   chan error
	cancel context.CancelFunc
}

func (s *suite) subscribe(t *testing.T) *subscription {
	ctx, cancel := context.WithCancel(context.Background())
	sub := &subscription{events: make(chan *nodev1.Event, 1024), done: make(chan error, 1), cancel: cancel}
	go func() {
		sub.done <- s.n.Events(ctx, func(ev *nodev1.Event) {
			select {
			case sub.events <- ev:
			default:
			}
		})
	}()
	t.Cleanup(func() { sub.close(t) })
	return sub
}

// close ends the stream: Events must then return nil, promptly.
func (sub *subscription) close(t *testing.T) {
	if sub.cancel == nil {
		return
	}
	sub.cancel()
	sub.cancel = nil
	select {
	case err := <-sub.done:
		if err != nil {
			t.Errorf("Events ended with %v once its context ended, want nil", err)
		}
	case <-time.After(wait):
		t.Errorf("Events did not return within %v of its context ending", wait)
	}
}

func (sub *subscription) next(t *testing.T) *nodev1.Event {
	t.Helper()
	select {
	case ev := <-sub.events:
		return ev
	case err := <-sub.done:
		t.Fatalf("the event stream ended: %v", err)
	case <-time.After(wait):
		t.Fatalf("no event within %v", wait)
	}
	return nil
}

// testEvents: every subscription begins with a SYNC; a sandbox that ends
// on its own is reported (EXITED or OOM_KILLED) and no longer listed; a
// sandbox killed on request is not reported.
func (s *suite) testEvents(t *testing.T) {
	a, b := s.subscribe(t), s.subscribe(t)
	for i, sub := range []*subscription{a, b} {
		if ev := sub.next(t); ev.Kind != nodev1.Event_KIND_SYNC {
			t.Fatalf("subscription %d began with %v, want SYNC", i, ev)
		}
	}
	b.close(t)
	killed := s.create(t, &nodev1.CreateRequest{SandboxId: ids.New()})
	crashed := s.create(t, &nodev1.CreateRequest{SandboxId: ids.New()})
	s.kill(t, killed.Id)
	s.opts.Crash(t, crashed.Id)
	for {
		ev := a.next(t)
		if ev.SandboxId == killed.Id {
			t.Errorf("sandbox %s killed on request was reported: %v", killed.Id, ev)
		}
		if ev.SandboxId != crashed.Id {
			continue
		}
		if ev.Kind != nodev1.Event_KIND_EXITED && ev.Kind != nodev1.Event_KIND_OOM_KILLED {
			t.Errorf("the crash of %s reported as %v, want EXITED", crashed.Id, ev)
		}
		if ev.Reason == "" {
			t.Errorf("the crash of %s reported without a reason", crashed.Id)
		}
		break
	}
	if s.listed(t, crashed.Id) != nil {
		t.Errorf("sandbox %s listed after its exit was reported", crashed.Id)
	}
	_, err := s.n.Kill(ctxT(t), &nodev1.KillRequest{SandboxId: crashed.Id})
	wantCode(t, "a kill of a sandbox that ended", err, connect.CodeNotFound)
}

// fromTemplate and fromSnapshot are a create's source.
func fromTemplate(id string) *nodev1.CreateRequest_TemplateId {
	return &nodev1.CreateRequest_TemplateId{TemplateId: id}
}

func fromSnapshot(id string) *nodev1.CreateRequest_SnapshotId {
	return &nodev1.CreateRequest_SnapshotId{SnapshotId: id}
}

// testSnapshotTransfer: a snapshot the node exports comes as chunks of
// files, each then described (size, sha256), and a last part; imported
// back after it was deleted, in steps (a cut between them keeps what
// arrived), it is the node's again and starts sandboxes. Chunks out of
// place, names outside the transfer and files that do not match are
// refused.
func (s *suite) testSnapshotTransfer(t *testing.T) {
	ctx := ctxT(t)
	begin := func(id string) (*nodev1.ImportSnapshotResponse, error) {
		return s.n.ImportSnapshot(ctx, &nodev1.ImportSnapshotRequest{SnapshotId: id, Step: nodev1.ImportSnapshotRequest_STEP_BEGIN,
			TemplateId: s.opts.Template})
	}
	if !s.opts.Snapshots {
		_, err := begin("nodetest-import")
		wantCode(t, "an import on a node without snapshots", err, connect.CodeUnimplemented)
		return
	}
	err := s.n.ExportSnapshot(ctx, &nodev1.ExportSnapshotRequest{SnapshotId: "nodetest-no-such-snapshot"},
		func(*nodev1.SnapshotPart) error { return nil })
	wantCode(t, "exporting an unknown snapshot", err, connect.CodeNotFound)

	sb := s.create(t, &nodev1.CreateRequest{SandboxId: ids.New(), EnvVars: map[string]string{"NODETEST_VAR": "moved"}})
	snap, err := s.n.Snapshot(ctx, &nodev1.SnapshotRequest{SandboxId: sb.Id, Kind: string(snapshot.KindSnapshot)})
	if err != nil {
		t.Fatalf("snapshotting: %v", err)
	}
	t.Cleanup(func() { s.n.DeleteSnapshot(context.Background(), &nodev1.DeleteSnapshotRequest{Id: snap.Id}) })
	type chunk struct {
		file   string
		offset int64
		data   []byte
	}
	var chunks []chunk
	var files []*nodev1.TransferFile
	last := false
	err = s.n.ExportSnapshot(ctx, &nodev1.ExportSnapshotRequest{SnapshotId: snap.Id}, func(p *nodev1.SnapshotPart) error {
		switch {
		case last:
			t.Errorf("a part after the last: %+v", p)
		case p.Last:
			last = true
		case p.Done != nil:
			files = append(files, p.Done)
		default:
			chunks = append(chunks, chunk{p.File, p.Offset, slices.Clone(p.Data)})
		}
		return nil
	})
	if err != nil || !last || len(files) == 0 || len(chunks) == 0 {
		t.Fatalf("exporting snapshot %s: %d files, %d chunks, last %v, %v", snap.Id, len(files), len(chunks), last, err)
	}
	sizes := map[string]int64{}
	for _, c := range chunks {
		if c.offset != sizes[c.file] {
			t.Fatalf("a chunk of %s at %d after %d bytes of it", c.file, c.offset, sizes[c.file])
		}
		sizes[c.file] += int64(len(c.data))
	}
	for _, f := range files {
		if !strings.HasPrefix(f.Name, "snapshot/") || sizes[f.Name] != f.Size || len(f.Sha256) != 64 {
			t.Fatalf("file %+v: %d bytes sent; want a snapshot/ name, its size and a sha256", f, sizes[f.Name])
		}
	}
	if st, err := begin(snap.Id); err != nil || !st.Present {
		t.Fatalf("beginning the import of a snapshot the node has: %+v %v; want it present", st, err)
	}

	// Back into the node once it is gone from it: the first chunk, a cut
	// (a new BEGIN), the rest.
	if _, err := s.n.DeleteSnapshot(ctx, &nodev1.DeleteSnapshotRequest{Id: snap.Id}); err != nil {
		t.Fatal(err)
	}
	step := func(req *nodev1.ImportSnapshotRequest) error {
		req.SnapshotId = snap.Id
		_, err := s.n.ImportSnapshot(ctx, req)
		return err
	}
	chunkReq := func(c chunk) *nodev1.ImportSnapshotRequest {
		return &nodev1.ImportSnapshotRequest{Step: nodev1.ImportSnapshotRequest_STEP_CHUNK, File: c.file, Offset: c.offset, Data: c.data}
	}
	st, err := begin(snap.Id)
	if err != nil || st.Present || len(st.Received) != 0 || !st.TemplatePresent {
		t.Fatalf("beginning an import: %+v %v; want nothing received, the template present", st, err)
	}
	if err := step(chunkReq(chunks[0])); err != nil {
		t.Fatal(err)
	}
	err = step(&nodev1.ImportSnapshotRequest{Step: nodev1.ImportSnapshotRequest_STEP_CHUNK, File: chunks[0].file,
		Offset: chunks[0].offset + int64(len(chunks[0].data)) + 1, Data: []byte("x")})
	wantCode(t, "a chunk past what the node has", err, connect.CodeInvalidArgument)
	err = step(&nodev1.ImportSnapshotRequest{Step: nodev1.ImportSnapshotRequest_STEP_CHUNK, File: "snapshot/../escape", Data: []byte("x")})
	wantCode(t, "a chunk named outside the transfer", err, connect.CodeInvalidArgument)
	err = step(&nodev1.ImportSnapshotRequest{Step: nodev1.ImportSnapshotRequest_STEP_COMMIT, Files: files})
	wantCode(t, "committing an import cut short", err, connect.CodeUnavailable)
	st, err = begin(snap.Id)
	if err != nil || st.Received[chunks[0].file] != int64(len(chunks[0].data)) {
		t.Fatalf("after a cut the node has %+v (%v); want the first chunk's %d bytes of %s", st.Received, err, len(chunks[0].data), chunks[0].file)
	}
	for _, c := range chunks[1:] {
		if err := step(chunkReq(c)); err != nil {
			t.Fatalf("importing a chunk of %s at %d: %v", c.file, c.offset, err)
		}
	}
	bad := slices.Clone(files)
	bad[0] = &nodev1.TransferFile{Name: files[0].Name, Size: files[0].Size, Sha256: strings.Repeat("0", 64)}
	err = step(&nodev1.ImportSnapshotRequest{Step: nodev1.ImportSnapshotRequest_STEP_COMMIT, Files: bad})
	wantCode(t, "committing a file whose checksum does not match", err, connect.CodeUnavailable)
	// The file that did not match is dropped: it goes again.
	st, err = begin(snap.Id)
	if err != nil || st.Received[files[0].Name] != 0 {
		t.Fatalf("after a mismatch the node keeps %+v (%v); want %s dropped", st.Received, err, files[0].Name)
	}
	for _, c := range chunks {
		if c.file == files[0].Name {
			if err := step(chunkReq(c)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := step(&nodev1.ImportSnapshotRequest{Step: nodev1.ImportSnapshotRequest_STEP_COMMIT, Files: files}); err != nil {
		t.Fatalf("committing the import: %v", err)
	}
	if got, err := s.n.GetSnapshot(ctx, &nodev1.GetSnapshotRequest{IdOrName: snap.Id}); err != nil || got.SandboxId != sb.Id {
		t.Fatalf("the imported snapshot: %+v %v", got, err)
	}
	child := s.create(t, &nodev1.CreateRequest{Source: fromSnapshot(snap.Id)})
	if got := s.opts.Getenv(t, child, "NODETEST_VAR"); got != "moved" {
		t.Errorf("a sandbox from the imported snapshot sees NODETEST_VAR=%q, want moved", got)
	}

	// An abort drops what arrived.
	if err := step(&nodev1.ImportSnapshotRequest{SnapshotId: "nodetest-import"}); err == nil {
		t.Error("an import step of no kind was taken")
	}
	if _, err := s.n.ImportSnapshot(ctx, &nodev1.ImportSnapshotRequest{SnapshotId: "nodetest-import",
		Step: nodev1.ImportSnapshotRequest_STEP_CHUNK, File: "snapshot/f", Data: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.n.ImportSnapshot(ctx, &nodev1.ImportSnapshotRequest{SnapshotId: "nodetest-import",
		Step: nodev1.ImportSnapshotRequest_STEP_ABORT}); err != nil {
		t.Fatal(err)
	}
	if st, err := begin("nodetest-import"); err != nil || len(st.Received) != 0 {
		t.Fatalf("after an abort the node keeps %+v (%v)", st, err)
	}
	s.n.ImportSnapshot(ctx, &nodev1.ImportSnapshotRequest{SnapshotId: "nodetest-import", Step: nodev1.ImportSnapshotRequest_STEP_ABORT})
}
