package cluster

import (
	"context"
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi/nodetest"
	"github.com/aenvhq/aenv/internal/state"
)

// fullSpec sets every setting of a Spec a create can carry (volumes
// apart: they need a volume's node), each to a value other than its zero.
func fullSpec() Spec {
	return Spec{
		Metadata: map[string]string{"team": "a"}, Timeout: time.Hour,
		AutoPause: true, AutoPauseFilesOnly: true, AutoResume: true,
		AllowInternet:  true,
		Network:        NetworkRules{AllowOut: []string{"10.1.0.0/16"}, DenyOut: []string{"0.0.0.0/0"}, MaskRequestHost: "x:${PORT}"},
		PrivateTraffic: true, Secure: true,
	}
}

// TestFullSpecIsFull: fullSpec leaves no field of Spec at its zero value,
// so that the tests below notice a copy that drops a field added later.
func TestFullSpecIsFull(t *testing.T) {
	v := reflect.ValueOf(fullSpec())
	for i := range v.NumField() {
		if f := v.Type().Field(i).Name; v.Field(i).IsZero() && f != "Mounts" && f != "CPUCount" && f != "MemoryMB" {
			t.Errorf("fullSpec leaves %s unset: set it, so that the copies of it are checked", f)
		}
	}
}

// TestForkKeepsSpec: a fork's children have their parent's spec whole
// (autoPauseFilesOnly too), with only their own timeout.
func TestForkKeepsSpec(t *testing.T) {
	ctx := context.Background()
	c := openCluster(t, state.NewMemory(), nodetest.NewFake("n1"))
	parent, err := c.Create(ctx, CreateRequest{Spec: fullSpec(), TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Fork(ctx, parent.ID, 2, 5*time.Minute, Owner{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		got, want := r.Sandbox.Spec, parent.Spec
		want.Timeout = 5 * time.Minute
		if !reflect.DeepEqual(got, want) {
			t.Errorf("child's spec:\n%+v\nwant its parent's:\n%+v", got, want)
		}
		if r.Sandbox.TrafficAccessToken == "" || r.Sandbox.TrafficAccessToken == parent.TrafficAccessToken {
			t.Errorf("a private parent's child has traffic token %q (parent's %q), want its own", r.Sandbox.TrafficAccessToken, parent.TrafficAccessToken)
		}
	}
}

// TestForkFanOut: a fork runs RestoresPerCPU restores per CPU of its
// nodes at once (a restore mostly waits), no more, and its children go to
// the other node when the parent's is full.
func TestForkFanOut(t *testing.T) {
	ctx := context.Background()
	nodes := nodetest.NewFakes("n1", "n2")
	c, _ := remoteFleet(t, state.NewMemory(), nodes...)
	if _, err := c.SetDraining(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	parent := create(t, c, time.Hour)
	if _, err := c.SetDraining(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.SetDelay(50 * time.Millisecond)
	}
	// n1 takes none: all 20 go to n2, RestoresPerCPU × the 4 CPUs of
	// the two nodes at a time.
	nodes[0].SetFull(true)
	res, err := c.Fork(ctx, parent.ID, 20, time.Minute, Owner{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Err != nil {
			t.Fatalf("child %d: %v", i, r.Err)
		}
		if r.Sandbox.NodeID != "n2" {
			t.Errorf("child %d on %s, want n2 (n1 is full)", i, r.Sandbox.NodeID)
		}
	}
	want := RestoresPerCPU * 4
	if got := nodes[1].PeakCreates(); got != want {
		t.Errorf("%d restores ran at once on n2, want %d", got, want)
	}
}

// TestClientIDFollowsTheSandbox: E2B's clientID names the node the
// sandbox runs on now, after a resume or a migration to another node.
func TestClientIDFollowsTheSandbox(t *testing.T) {
	ctx := context.Background()
	nodes := nodetest.NewFakes("n1", "n2")
	c, _ := remoteFleet(t, state.NewMemory(), nodes...)
	if _, err := c.SetDraining(ctx, "n2", true); err != nil {
		t.Fatal(err)
	}
	sb := create(t, c, time.Hour)
	if sb.NodeID != "n1" || sb.ClientID() != "n1" {
		t.Fatalf("created on %s, clientID %s; want n1", sb.NodeID, sb.ClientID())
	}
	if err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetDraining(ctx, "n2", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetDraining(ctx, "n1", true); err != nil {
		t.Fatal(err)
	}
	got, resumed, err := c.Connect(ctx, sb.ID, time.Minute)
	if err != nil || !resumed {
		t.Fatalf("resume: %v, %v", resumed, err)
	}
	if got.NodeID != "n2" || got.ClientID() != "n2" {
		t.Fatalf("resumed on %s with clientID %s; want n2 for both", got.NodeID, got.ClientID())
	}
	if _, err := c.SetDraining(ctx, "n1", false); err != nil {
		t.Fatal(err)
	}
	m, err := c.Migrate(ctx, sb.ID, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := c.Get(ctx, sb.ID); m.Sandbox.ClientID() != "n1" || again.ClientID() != "n1" {
		t.Fatalf("migrated to n1, clientID %s (record %s)", m.Sandbox.ClientID(), again.ClientID())
	}
}

// recordV0 is a sandbox record as servers before the storage schema
// wrote it (the API's Sandbox with its JSON tags, plus op): it must still
// decode.
const recordV0 = `{"id":"sb1","templateID":"tpl1","alias":"my-tpl","clientID":"n1","nodeID":"n1",` +
	`"metadata":{"k":"v"},"state":"running","startedAt":"2026-11-30T10:00:00Z","endAt":"2026-11-30T11:00:00Z",` +
	`"cpuCount":2,"memoryMB":512,"diskMB":1024,"envdVersion":"0.2.0","envdAccessToken":"etok",` +
	`"autoPause":true,"autoPauseFilesOnly":true,"autoResume":true,"timeout":3600000000000,"addr":"10.0.0.7",` +
	`"allowInternet":true,"allowOut":["1.1.1.1"],"denyOut":["0.0.0.0/0"],"maskRequestHost":"h:${PORT}",` +
	`"keyID":"k1","team":"t1","mounts":[{"name":"data","path":"/data","volumeID":"vol1"}],` +
	`"trafficAccessToken":"ttok","op":"fork","opSince":"2026-11-30T10:30:00Z"}`

// TestStoredRecordSchemas: a record written before the schema decodes to
// the sandbox it described (its settings read off its tokens), and what
// this server writes is schema 1 with its own field names, which decodes
// back to the same record.
func TestStoredRecordSchemas(t *testing.T) {
	at := func(s string) time.Time { tm, _ := time.Parse(time.RFC3339, s); return tm }
	want := record{Sandbox: Sandbox{
		Spec: Spec{Metadata: map[string]string{"k": "v"}, Timeout: time.Hour,
			AutoPause: true, AutoPauseFilesOnly: true, AutoResume: true, CPUCount: 2, MemoryMB: 512, AllowInternet: true,
			Network:        NetworkRules{AllowOut: []string{"1.1.1.1"}, DenyOut: []string{"0.0.0.0/0"}, MaskRequestHost: "h:${PORT}"},
			PrivateTraffic: true, Secure: true,
			Mounts: []VolumeMount{{Name: "data", Path: "/data", VolumeID: "vol1"}}},
		ID: "sb1", TemplateID: "tpl1", Alias: "my-tpl", NodeID: "n1", State: StateRunning,
		StartedAt: at("2026-11-30T10:00:00Z"), EndAt: at("2026-11-30T11:00:00Z"), DiskMB: 1024,
		EnvdVersion: "0.2.0", EnvdAccessToken: "etok", Addr: netip.MustParseAddr("10.0.0.7"),
		KeyID: "k1", Team: "t1", TrafficAccessToken: "ttok",
	}, Op: "fork", OpSince: at("2026-11-30T10:30:00Z")}
	got, err := decodeRecord(nil, state.Entry{Key: sandboxKey("sb1"), Value: []byte(recordV0)})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("version 0 record decoded to\n%+v\nwant\n%+v", got, want)
	}

	b, err := encodeRecord(nil, &got)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		t.Fatal(err)
	}
	if fields["schema"] != float64(recordSchema) || fields["privateTraffic"] != true || fields["secure"] != true {
		t.Errorf("stored record lacks its schema or settings: %s", b)
	}
	if _, ok := fields["clientID"]; ok {
		t.Errorf("stored record keeps a clientID, which goes stale when the sandbox moves: %s", b)
	}
	for _, f := range []string{"Spec", "Network", "ID", "NodeID"} {
		if _, ok := fields[f]; ok {
			t.Errorf("stored record has the Go field name %q: the API struct leaked into the schema: %s", f, b)
		}
	}
	back, err := decodeRecord(nil, state.Entry{Key: sandboxKey("sb1"), Value: b})
	if err != nil || !reflect.DeepEqual(back, want) {
		t.Fatalf("round trip: %+v, %v", back, err)
	}

	// A schema 1 record says its settings; its tokens do not decide them.
	plain := strings.Replace(string(b), `"privateTraffic":true,`, "", 1)
	if r, _ := decodeRecord(nil, state.Entry{Key: sandboxKey("sb1"), Value: []byte(plain)}); r.PrivateTraffic {
		t.Errorf("schema 1 record without privateTraffic read as private")
	}
}
