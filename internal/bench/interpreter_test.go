package bench

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aenvhq/aenv/internal/client"
)

// interpreterFakeAPI answers runCode('1+1') with answer in its live
// sandboxes.
type interpreterFakeAPI struct {
	*fakeAPI
	answer string
	codes  int
}

func (f *interpreterFakeAPI) RunCode(ctx context.Context, id, code, token string) (*client.Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.codes++
	if !f.live[id] || token != "tok-"+id || code != "1+1" {
		return nil, fmt.Errorf("bad runCode %q in %s (token %q)", code, id, token)
	}
	return &client.Execution{Text: f.answer}, nil
}

func TestMeasureRunCode(t *testing.T) {
	api := &interpreterFakeAPI{fakeAPI: newFakeAPI(), answer: "2"}
	res, err := MeasureRunCode(context.Background(), api, "tpl", 4, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.RunCode) != 4 || len(res.FirstResult) != 2 {
		t.Fatalf("%d round trips and %d firsts, want 4 and 2", len(res.RunCode), len(res.FirstResult))
	}
	// Each first result waited for the pool before its create, untimed.
	for _, d := range res.FirstResult {
		if d <= 0 || d >= firstResultSettle {
			t.Errorf("first result %v: want the create and runCode only", d)
		}
	}
	if api.codes != 3+4+2 || api.created != 3 {
		t.Errorf("%d runCodes in %d sandboxes, want 9 (3 warm-ups) in 3", api.codes, api.created)
	}
	if left := api.leaked(); len(left) > 0 {
		t.Errorf("left running: %v", left)
	}
}

func TestMeasureRunCodeWrongAnswerAndMissingTemplate(t *testing.T) {
	api := &interpreterFakeAPI{fakeAPI: newFakeAPI(), answer: "3"}
	if _, err := MeasureRunCode(context.Background(), api, "tpl", 2, 1, nil); err == nil || !strings.Contains(err.Error(), `"3"`) {
		t.Fatalf("a wrong answer: %v", err)
	}
	if left := api.leaked(); len(left) > 0 {
		t.Errorf("left running: %v", left)
	}
	_, err := MeasureRunCode(context.Background(), missingTemplate{api}, "code-interpreter", 2, 1, nil)
	if !client.IsStatus(err, http.StatusNotFound) {
		t.Fatalf("a missing template: %v, want the 404 wrapped", err)
	}
}

type missingTemplate struct{ *interpreterFakeAPI }

func (missingTemplate) Create(ctx context.Context, opts client.CreateOptions) (*client.Sandbox, error) {
	return nil, &client.APIError{Status: http.StatusNotFound, Message: "template " + opts.TemplateID + " not found"}
}

func TestEstimateHeld(t *testing.T) {
	node := client.Node{State: "ready", Capacity: client.NodeUsage{MemoryMB: 20000},
		Usage:            client.NodeUsage{MemoryMB: 4000, CommittedMemoryMB: 50000},
		MemoryOvercommit: 4, MemoryHighWater: 0.9, HostMemoryMB: 24000}
	// Commit: (80000-50000)/512 = 58; memory: (21600-4000) MiB / 20 MiB = 880.
	e := EstimateHeld([]client.Node{node}, 100, 512, 20<<20)
	if e.Max != 158 || e.Bound != "overcommit" || e.Overcommit != 4 || e.MemoryMB != 512 {
		t.Errorf("estimate %+v, want 100+58 bound by overcommit", e)
	}
	node.MemoryOvercommit, node.Usage.CommittedMemoryMB = 25, 30000
	e = EstimateHeld([]client.Node{node, {State: "draining", MemoryOvercommit: 4, HostMemoryMB: 1}}, 100, 512, 20<<20)
	if e.Max != 980 || e.Bound != "high water" {
		t.Errorf("estimate %+v, want 100+880 bound by high water (the draining node adds none)", e)
	}
	if e := EstimateHeld(nil, 7, 512, 20<<20); e.Max != 7 || e.Overcommit != 0 {
		t.Errorf("no nodes: %+v, want the held ones only", e)
	}
}

func TestAddBatchRunCodeIdle(t *testing.T) {
	r := NewReport(Options{}, 2)
	r.AddBatch(&BatchResult{Size: 100, Batch: ms(900, 1000, 1100), Parallel: ms(1500), PoolHeld: 100}, ms(4000))
	r.AddRunCode(RunCodeResults{RunCode: ms(20, 21, 22), FirstResult: ms(90)}, BareResults{Exec: ms(10), RunSerial: ms(100)})
	idle := &IdleResult{Sandboxes: 10, Before: map[string]int64{"MemAvailable": 1000 << 20}, After: map[string]int64{"MemAvailable": 800 << 20},
		Each: []IdleSandbox{{Cgroup: map[string]int64{"usage": 18 << 20}}}, MemoryMB: 512,
		Nodes: []client.Node{{State: "ready", Capacity: client.NodeUsage{MemoryMB: 24000}, MemoryOvercommit: 25, MemoryHighWater: 0.9, HostMemoryMB: 24000}}}
	r.AddIdle(idle, BareIdle{Sandboxes: 10, AvailableDrop: 10 << 20, Cgroup: 9 << 20, Available: 20000 << 20})
	rows := map[string]Row{}
	for _, row := range r.Rows {
		rows[row.Operation] = row
	}
	for op, want := range map[string]float64{
		"batch create of 100, all ready (pool held 100 at least)": 1000.0 / 4000,
		"100 single creates at once, all ready":                   1500.0 / 4000,
		"runCode('1+1') round trip":                               2.1,
		"code-interpreter create to first runCode result":         0.9,
	} {
		if got := rows[op].RatioP50; got < want-1e-9 || got > want+1e-9 {
			t.Errorf("%s: ratio %v, want %v (rows %v)", op, got, want, r.Rows)
		}
	}
	figures := map[string]Figure{}
	for _, f := range r.Figures {
		figures[f.Name] = f
	}
	if f := figures["host memory per idle sandbox (MemAvailable drop, 10 python3 asleep)"]; f.Aenv != 20 || f.Bare != 10 || f.Ratio != 2 {
		t.Errorf("idle memory figure %+v", f)
	}
	// 21600 MiB / 20 MiB = 1080 more, by the high water.
	held := figures["idle sandboxes held before admission refuses (memoryMB 512, overcommit 25, high water binds first)"]
	if held.Aenv != 10+1080 || held.Bare != 2000 {
		t.Errorf("held figure %+v (figures %v)", held, r.Figures)
	}
	met := map[string]bool{}
	for _, tg := range r.Targets {
		met[tg.Name] = tg.Met
	}
	if !met["batch create of 100: p50 <= 2s wall"] || met["runCode('1+1') round trip: p50 <= 15ms"] ||
		!met["code-interpreter create to first result: p50 <= 300ms"] || met["host memory per idle sandbox <= 12 MiB"] ||
		!met["idle sandboxes held before refusal >= 1,000"] {
		t.Errorf("targets %+v", r.Targets)
	}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"batch create of 100", "runCode('1+1') round trip", "idle sandboxes held", "MISSED"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}
