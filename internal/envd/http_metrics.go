package envd

import (
	"net/http"
	"sync"
	"time"
)

// metrics is the GET /metrics answer, in E2B's snake_case. The platform
// reads it; the SDK gets metrics from the control plane instead.
type metrics struct {
	Timestamp   int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskTotal   uint64  `json:"disk_total"`
	DiskUsed    uint64  `json:"disk_used"`
}

// cpuSampler turns the cumulative counters of /proc/stat into a usage
// percentage between two calls.
type cpuSampler struct {
	mu        sync.Mutex
	busy, all uint64
	sampledAt time.Time
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	m, err := s.collectMetrics(r.Context())
	if err != nil {
		writeHTTPError(w, err)
		return
	}
	m.Timestamp = time.Now().Unix()
	writeJSON(w, http.StatusOK, m)
}
