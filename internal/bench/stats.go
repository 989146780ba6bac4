package bench

import (
	"encoding/json"
	"math"
	"slices"
	"time"
)

// Summary condenses the samples of one operation.
type Summary struct {
	// N is the number of samples.
	N int
	// P50, P95 and P99 are nearest-rank percentiles: always a measured
	// value, never an interpolation between two.
	P50, P95, P99 time.Duration
}

// Summarize returns the summary of samples; it does not reorder them.
func Summarize(samples []time.Duration) Summary {
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	return Summary{
		N:   len(sorted),
		P50: Percentile(sorted, 50),
		P95: Percentile(sorted, 95),
		P99: Percentile(sorted, 99),
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// sorted: the smallest sample that at least p percent of the samples do not
// exceed. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	// p*n before the division keeps whole-number ranks exact (0.95*20 is
	// not 19 in floating point, 95*20/100 is).
	rank := int(math.Ceil(p * float64(n) / 100))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Ratio returns a/b, or 0 when either is missing (0), so that a report never
// shows a ratio made up from an absent measurement.
func Ratio(a, b time.Duration) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// MarshalJSON writes durations as fractional milliseconds, the unit a reader
// of a latency report expects.
func (s Summary) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		N     int     `json:"n"`
		P50MS float64 `json:"p50_ms"`
		P95MS float64 `json:"p95_ms"`
		P99MS float64 `json:"p99_ms"`
	}{s.N, millis(s.P50), millis(s.P95), millis(s.P99)})
}

// millis converts d to milliseconds rounded to microseconds.
func millis(d time.Duration) float64 {
	return float64(d.Round(time.Microsecond)) / float64(time.Millisecond)
}
