package bench

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func TestPercentileNearestRank(t *testing.T) {
	oneToTwenty := make([]int, 20)
	for i := range oneToTwenty {
		oneToTwenty[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single p50", ms(7), 50, 7 * time.Millisecond},
		{"single p95", ms(7), 95, 7 * time.Millisecond},
		// 95% of 20 is exactly rank 19: floating point must not make it 20.
		{"twenty p95", ms(oneToTwenty...), 95, 19 * time.Millisecond},
		{"twenty p50", ms(oneToTwenty...), 50, 10 * time.Millisecond},
		{"twenty p100", ms(oneToTwenty...), 100, 20 * time.Millisecond},
		{"even p50 takes the lower middle", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"odd p50 is the median", ms(1, 2, 3), 50, 2 * time.Millisecond},
		{"small p95 is the maximum", ms(1, 2, 3), 95, 3 * time.Millisecond},
		{"ten p95", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 95, 10 * time.Millisecond},
		{"p near zero is the minimum", ms(4, 5, 6), 0.1, 4 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
			}
		})
	}
}

func TestSummarizeSortsACopy(t *testing.T) {
	in := ms(30, 10, 20, 50, 40)
	orig := slices.Clone(in)
	s := Summarize(in)
	if s.N != 5 || s.P50 != 30*time.Millisecond || s.P95 != 50*time.Millisecond {
		t.Errorf("Summarize = %+v, want N=5 P50=30ms P95=50ms", s)
	}
	if !slices.Equal(in, orig) {
		t.Errorf("Summarize reordered its input: %v", in)
	}
	if z := Summarize(nil); z != (Summary{}) {
		t.Errorf("Summarize(nil) = %+v, want zero", z)
	}
}

func TestRatio(t *testing.T) {
	if r := Ratio(300*time.Millisecond, 200*time.Millisecond); r != 1.5 {
		t.Errorf("Ratio(300ms, 200ms) = %v, want 1.5", r)
	}
	for _, c := range [][2]time.Duration{{0, time.Second}, {time.Second, 0}, {0, 0}} {
		if r := Ratio(c[0], c[1]); r != 0 {
			t.Errorf("Ratio(%v, %v) = %v, want 0 (missing)", c[0], c[1], r)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "-"},
		{420 * time.Microsecond, "0.42ms"},
		{3210 * time.Microsecond, "3.21ms"},
		{312*time.Millisecond + 449*time.Microsecond, "312.4ms"},
		{2500 * time.Millisecond, "2500.0ms"},
		{12345 * time.Millisecond, "12.35s"},
	}
	for _, tt := range tests {
		if got := FormatDuration(tt.d); got != tt.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestFormatRatio(t *testing.T) {
	if got := FormatRatio(1.254); got != "1.25x" {
		t.Errorf("FormatRatio(1.254) = %q", got)
	}
	if got := FormatRatio(0); got != "-" {
		t.Errorf("FormatRatio(0) = %q, want -", got)
	}
}

func TestSummaryJSONInMilliseconds(t *testing.T) {
	b, err := json.Marshal(Summary{N: 3, P50: 1500 * time.Microsecond, P95: 2 * time.Second, P99: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"n":3,"p50_ms":1.5,"p95_ms":2000,"p99_ms":3000}`; got != want {
		t.Errorf("JSON = %s, want %s", got, want)
	}
}

func testReport() Report {
	a := AenvResults{
		CreateSerial:     ms(300, 310, 320, 400),
		CreateConcurrent: ms(900, 1000),
		PoolConcurrent:   1,
		CreateBackToBack: ms(350, 360, 380),
		PoolBackToBack:   4,
		Command:          ms(20, 22, 24),
		CommandSpaced:    ms(8, 9, 10),
	}
	b := BareResults{
		RunSerial: ms(200, 210, 220, 230),
		// RunConcurrent missing: its ratio must show as missing.
		Exec:       ms(10, 11, 12),
		ExecShell:  ms(16, 17, 18),
		ExecSpaced: ms(12, 13, 14),
	}
	opts := Options{Iterations: 4, Concurrency: 2, RunscPath: "/usr/bin/runsc", RootFS: "/rootfs"}
	r := NewReport(opts, 2)
	r.AddCreate(opts, a, b)
	return r
}

func TestNewReportPairsOperations(t *testing.T) {
	r := testReport()
	if r.Template != DefaultTemplate || r.Concurrency != 2 || r.CPUs != 2 {
		t.Errorf("report header = %+v", r)
	}
	want := []struct {
		op, base string
		ratio    float64
	}{
		{"create to first command, c=1", "runsc run /bin/true", 310.0 / 210},
		{"create to first command, c=1, back to back, pool held 4", "runsc run /bin/true", 360.0 / 210},
		{"create to first command, c=2, pool held 1", "runsc run /bin/true, 2 at once", 0},
		{"command round trip", "runsc exec /bin/true", 22.0 / 11},
		{"command round trip", "runsc exec /bin/bash -l -c true", 22.0 / 17},
		{"command round trip, 100 ms apart", "runsc exec /bin/true, 100 ms apart", 9.0 / 13},
	}
	if len(r.Rows) != len(want) {
		t.Fatalf("got %d rows, want %d", len(r.Rows), len(want))
	}
	for i, w := range want {
		row := r.Rows[i]
		if row.Operation != w.op || row.Baseline != w.base {
			t.Errorf("row %d = %q / %q, want %q / %q", i, row.Operation, row.Baseline, w.op, w.base)
		}
		if d := row.RatioP50 - w.ratio; d > 1e-9 || d < -1e-9 {
			t.Errorf("row %d ratio = %v, want %v", i, row.RatioP50, w.ratio)
		}
	}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := testReport().WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"2 CPUs", "/usr/bin/runsc", "AENV/BARE P50"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(out, "\n")
	var c1, c2 string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "create to first command, c=1 "):
			c1 = l
		case strings.HasPrefix(l, "create to first command, c=2, pool held 1 "):
			c2 = l
		}
	}
	if f := strings.Fields(c1); len(f) < 13 || f[5] != "4/4" || f[6] != "310.0ms" || f[7] != "400.0ms" || f[8] != "400.0ms" ||
		f[9] != "210.0ms" || f[10] != "230.0ms" || f[11] != "230.0ms" || f[12] != "1.48x" {
		t.Errorf("c=1 line = %q", c1)
	}
	if f := strings.Fields(c2); len(f) < 16 || f[8] != "2/0" || f[12] != "-" || f[15] != "-" {
		t.Errorf("c=2 line = %q (missing baseline must print -)", c2)
	}
}

func TestWriteJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := testReport().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var got struct {
		CPUs int `json:"cpus"`
		Rows []struct {
			Operation string             `json:"operation"`
			Aenv      map[string]float64 `json:"aenv"`
			Bare      map[string]float64 `json:"bare"`
			RatioP50  *float64           `json:"ratio_p50"`
		} `json:"rows"`
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("decoding %s: %v", buf.String(), err)
	}
	if got.CPUs != 2 || len(got.Rows) != 6 {
		t.Fatalf("decoded %+v", got)
	}
	if r := got.Rows[0]; r.Aenv["p50_ms"] != 310 || r.Bare["n"] != 4 || r.RatioP50 == nil {
		t.Errorf("row 0 = %+v", r)
	}
	if r := got.Rows[2]; r.RatioP50 != nil {
		t.Errorf("row 2 has a ratio %v without a baseline", *r.RatioP50)
	}
}

// TestReportBurstsAndFigures: the two bursts are rows against the same
// bare burst, named by what the pool held; CPU and rates are figures with
// their ratio; the burst targets are judged on the pooled burst's p50 and
// p99 and on the first burst's ratio.
func TestReportBurstsAndFigures(t *testing.T) {
	a := AenvResults{
		CreateSerial: ms(20), Command: ms(12),
		Burst: ms(800, 900, 1000), BurstPooled: ms(100, 200, 1200), PoolBefore: 2, PoolTaught: 3,
		CPUPerCreate: 0.05, CPUPerCommand: 0.03, CreatesPerSecond: 30,
	}
	b := BareResults{RunSerial: ms(80), Exec: ms(9), Burst: ms(1000, 1100, 1200), CPUPerRun: 0.025, CPUPerExecShell: 0.04, RunsPerSecond: 20}
	opts := Options{Iterations: 1, Concurrency: 2}
	r := NewReport(opts, 2)
	r.AddCreate(opts, a, b)
	rows := map[string]Row{}
	for _, row := range r.Rows {
		rows[row.Operation] = row
	}
	empty, ok1 := rows["create to first command, c=3, pool held 2"]
	pooled, ok2 := rows["create to first command, c=3, pool refilled, pool held 3"]
	if !ok1 || !ok2 {
		t.Fatalf("rows %v lack the two bursts", slices.Collect(maps.Keys(rows)))
	}
	if empty.Bare.P50 != 1100*time.Millisecond || pooled.Bare.P50 != 1100*time.Millisecond || pooled.Aenv.P99 != 1200*time.Millisecond {
		t.Errorf("bursts: %+v, %+v", empty, pooled)
	}
	met := map[string]bool{}
	for _, tg := range r.Targets {
		met[tg.Name] = tg.Met
	}
	// p50 200ms but p99 1.2s: missed; 900/1100 = 0.82x: missed; 20ms:
	// met; 12ms: met.
	for name, want := range map[string]bool{
		"3 creates at once after a burst taught the pool: p50 <= 300ms, p99 <= 1s":      false,
		"3 creates at once, first burst: p50 <= 0.8x bare":                              false,
		"create to first command, c=1, the pool caught up between creates: p50 <= 25ms": true,
		"command round trip: p50 <= 15ms or <= 1.2x bare runsc exec":                    true,
	} {
		if got, ok := met[name]; !ok || got != want {
			t.Errorf("target %q: met %v (present %v), want %v", name, got, ok, want)
		}
	}
	if len(r.Figures) != 3 || r.Figures[0].Aenv != 50 || r.Figures[0].Bare != 25 || r.Figures[0].Ratio != 2 ||
		r.Figures[1].Aenv != 30 || r.Figures[1].Bare != 40 || r.Figures[1].Ratio != 0.75 ||
		r.Figures[2].Aenv != 30 || r.Figures[2].Ratio != 1.5 {
		t.Errorf("figures = %+v", r.Figures)
	}
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "50.0 CPU-ms") || !strings.Contains(buf.String(), "30.0 /s") {
		t.Errorf("the table lacks the figures:\n%s", buf.String())
	}
}
