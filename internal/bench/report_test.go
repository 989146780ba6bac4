package bench

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func snapshotReport() Report {
	opts := Options{SnapshotIterations: 3, RunscPath: "/usr/bin/runsc", RootFS: "/rootfs"}
	res := SnapshotResults{
		Aenv: []SizeSamples{{Size: Size{Name: "small"}, Samples: SnapshotSamples{
			Snapshot: ms(100, 110, 120), Pause: ms(130, 140, 150),
			Resume: ms(400, 410, 420), ResumeCommand: ms(450, 460, 470), FromSnapshot: ms(500, 510, 520),
			Fork:       map[int][]time.Duration{1: ms(600, 610, 620), 4: ms(1600)},
			ForkTaught: map[int][]time.Duration{4: ms(900)}, TaughtPrepared: 4,
			MemoryBytes: 16 << 20, ImageBytes: 2 << 20,
		}}, {Size: Size{Name: "dirty"}, Samples: SnapshotSamples{
			Resume: ms(1000),
			Fork:   map[int][]time.Duration{},
		}}},
		Memory: &MemoryResults{
			Sandboxes: 2,
			Running:   MemorySample{AvailableBytes: 1000 << 20, CgroupBytes: 40 << 20, Cgroups: 2},
			Paused:    MemorySample{AvailableBytes: 1036 << 20},
			Resumed:   MemorySample{AvailableBytes: 998 << 20, CgroupBytes: 42 << 20, Cgroups: 2},
			Pause:     ms(200, 210), Resume: ms(400, 420),
		},
	}
	res.Bare = []SizeSamples{{Size: Size{Name: "dirty"}, Samples: SnapshotSamples{Resume: ms(500)}},
		{Size: Size{Name: "small"}, Samples: SnapshotSamples{
			Snapshot: ms(90, 100, 110), Pause: ms(130), Resume: ms(350, 360, 370), ResumeCommand: ms(380),
			FromSnapshot: ms(400), Fork: map[int][]time.Duration{1: ms(500), 4: ms(1200)},
			MemoryBytes: 15 << 20, ImageBytes: 2 << 20,
		}}}
	r := NewReport(opts, 2)
	r.AddSnapshot(opts, res)
	return r
}

func TestAddSnapshotRows(t *testing.T) {
	r := snapshotReport()
	if r.SnapshotIterations != 3 || r.Iterations != 0 {
		t.Errorf("header = %+v", r)
	}
	rows := map[string]Row{}
	for _, row := range r.Rows {
		rows[row.Operation] = row
	}
	for op, want := range map[string]float64{
		"snapshot (leave running), small":               110.0 / 100,
		"pause, small":                                  140.0 / 130,
		"resume, small":                                 410.0 / 360,
		"resume + first command, small":                 460.0 / 380,
		"create from snapshot to first command, small":  510.0 / 400,
		"fork 1, small: wall":                           610.0 / 500,
		"fork 4, small: wall":                           1600.0 / 1200,
		"fork 4, small: per child":                      400.0 / 300,
		"fork 4, small, pool taught (4 prepared): wall": 900.0 / 1200,
		"resume, dirty":                                 2,
		"snapshot (leave running), dirty":               0,
	} {
		row, ok := rows[op]
		if !ok {
			t.Errorf("no row %q", op)
			continue
		}
		if d := row.RatioP50 - want; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s: ratio %v, want %v", op, row.RatioP50, want)
		}
	}
	if _, ok := rows["fork 1, small: per child"]; ok {
		t.Error("a per-child row for a fork of 1 repeats the wall row")
	}
	if row := rows["fork 4, small: per child"]; row.Aenv.P50 != 400*time.Millisecond || row.Bare.P50 != 300*time.Millisecond {
		t.Errorf("per child = %+v", row)
	}
	if len(r.Sizes) != 2 || r.Sizes[0].AenvMemoryMiB != 16 || r.Sizes[0].BareMemoryMiB != 15 || r.Sizes[0].AenvImageMiB != 2 {
		t.Errorf("sizes = %+v", r.Sizes)
	}
	want := []Target{
		{"resume p50 within 1.2x of bare restore, small", "1.14x", true},
		{"resume p50 within 1.2x of bare restore, dirty", "2.00x", false},
		{"paused sandboxes keep no cgroup and no process", "0 cgroups, 0 processes", true},
	}
	if len(r.Targets) != len(want) {
		t.Fatalf("targets = %+v", r.Targets)
	}
	for i, w := range want {
		if r.Targets[i] != w {
			t.Errorf("target %d = %+v, want %+v", i, r.Targets[i], w)
		}
	}
	m := r.Memory
	if m == nil || m.FreedPerSandboxMiB != 18 || m.CgroupPerSandboxMiB != 20 || m.Running.Cgroups != 2 || m.Pause.P50 != 200*time.Millisecond {
		t.Errorf("memory = %+v", m)
	}
}

func TestAddSnapshotMissingBaselineAndLeftovers(t *testing.T) {
	opts := Options{}
	res := SnapshotResults{
		Aenv: []SizeSamples{{Size: Size{Name: "small"}, Samples: SnapshotSamples{Resume: ms(400)}}},
		Memory: &MemoryResults{Sandboxes: 1, Paused: MemorySample{Cgroups: 1},
			LeftProcesses: []string{"42: runsc-sandbox sb1"}},
	}
	r := NewReport(opts, 2)
	r.AddSnapshot(opts, res)
	if r.Targets[0].Met || r.Targets[0].Value != "-" {
		t.Errorf("a resume without baseline met its target: %+v", r.Targets[0])
	}
	if r.Targets[1].Met || r.Targets[1].Value != "1 cgroups, 1 processes" {
		t.Errorf("leftovers met the target: %+v", r.Targets[1])
	}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "process left by a paused sandbox: 42: runsc-sandbox sb1") {
		t.Errorf("table does not name the process left:\n%s", buf.String())
	}
}

func TestWriteTableWithBothSuites(t *testing.T) {
	r := snapshotReport()
	c := testReport()
	r.Iterations, r.Concurrency = c.Iterations, c.Concurrency
	r.Rows = append(c.Rows, r.Rows...)
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"2 CPUs, template base, 4 iterations, concurrency 2, 3 snapshot iterations",
		"create to first command, c=1",
		"fork 4, small: per child",
		"small: aenv 16.0 MiB, image 2.0 MiB; bare 15.0 MiB, image 2.0 MiB",
		"memory, 2 small sandboxes",
		"freed by pausing: 18.0 MiB of host memory per sandbox (a running one's cgroup: 20.0 MiB)",
		"met    resume p50 within 1.2x of bare restore, small: 1.14x",
		"MISSED resume p50 within 1.2x of bare restore, dirty: 2.00x",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	var running string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "  running ") {
			running = l
		}
	}
	if f := strings.Fields(running); len(f) != 8 || f[1] != "1000.0" || f[5] != "2" || f[6] != "40.0" {
		t.Errorf("running line = %q", running)
	}
}

func TestWriteJSONSnapshot(t *testing.T) {
	var buf bytes.Buffer
	if err := snapshotReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var got struct {
		SnapshotIterations int `json:"snapshot_iterations"`
		Targets            []struct {
			Met bool `json:"met"`
		} `json:"targets"`
		Memory struct {
			Freed   float64            `json:"freed_per_sandbox_mib"`
			Running map[string]float64 `json:"running"`
			Pause   map[string]float64 `json:"pause"`
		} `json:"memory"`
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("decoding %s: %v", buf.String(), err)
	}
	if got.SnapshotIterations != 3 || len(got.Targets) != 3 || got.Memory.Freed != 18 ||
		got.Memory.Running["available_mib"] != 1000 || got.Memory.Pause["p50_ms"] != 200 {
		t.Errorf("decoded %+v", got)
	}
}
