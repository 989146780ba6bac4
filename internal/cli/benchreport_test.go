package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aenvhq/aenv/internal/bench"
)

// TestWriteBenchReport: --report's directory gets the JSON, the table and
// the chart of one report, and no temporary file is left beside them.
func TestWriteBenchReport(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new")
	r := bench.Report{CPUs: 2, Template: "base", Rows: []bench.Row{{Operation: "command round trip", Baseline: "runsc exec /bin/true",
		Aenv: bench.Summary{N: 1, P50: 27 * time.Millisecond}, Bare: bench.Summary{N: 1, P50: 21 * time.Millisecond}, RatioP50: 1.27}}}
	if err := writeBenchReport(dir, r); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 3 {
		t.Fatalf("the report's directory: %v %v, want bench.json, bench.svg, bench.txt", entries, err)
	}
	var back bench.Report
	b, _ := os.ReadFile(filepath.Join(dir, "bench.json"))
	if err := json.Unmarshal(b, &back); err != nil || len(back.Rows) != 1 || back.Rows[0].RatioP50 != 1.27 {
		t.Fatalf("bench.json: %+v %v", back, err)
	}
	for name, want := range map[string]string{"bench.txt": "command round trip", "bench.svg": "1.27x"} {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		if !strings.Contains(string(b), want) {
			t.Errorf("%s lacks %q:\n%s", name, want, b)
		}
	}
}
