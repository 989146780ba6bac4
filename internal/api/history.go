package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// maxLogLimit is the most log entries one request returns.
const maxLogLimit = 1000

// logLevels orders the levels a log filter names.
var logLevels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

// logEntryJSON is E2B's SandboxLogEntry.
type logEntryJSON struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logsV2 answers GET /v2/sandboxes/{id}/logs: the sandbox's lifecycle and
// process events, filtered (level: that level and above; search: in the
// message or a field) and paged by time (cursor in Unix milliseconds;
// forward from it, oldest first, or backward from it, newest first).
func (s *Handler) logsV2(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	limit, ok := logLimit(w, q)
	if !ok {
		return
	}
	cursor, ok := unixMillis(w, q, "cursor")
	if !ok {
		return
	}
	backward := false
	switch d := q.Get("direction"); d {
	case "", "forward":
	case "backward":
		backward = true
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("direction must be forward or backward, got %q", d))
		return
	}
	minLevel := 0
	if v := q.Get("level"); v != "" {
		l, ok := logLevels[strings.ToLower(v)]
		if !ok {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("level must be debug, info, warn or error, got %q", v))
			return
		}
		minLevel = l
	}
	search := strings.ToLower(q.Get("search"))

	entries, err := s.cfg.Cluster.Logs(r.Context(), id)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Timestamp.AsTime().Before(entries[j].Timestamp.AsTime()) })
	if backward {
		slices.Reverse(entries)
	}
	out := []logEntryJSON{}
	for _, e := range entries {
		at := e.Timestamp.AsTime()
		if !cursor.IsZero() && (!backward && at.Before(cursor) || backward && at.After(cursor)) {
			continue
		}
		if logLevels[e.Level] < minLevel || search != "" && !matchesLog(e, search) {
			continue
		}
		if len(out) == limit {
			break
		}
		fields := e.Fields
		if fields == nil {
			fields = map[string]string{}
		}
		out = append(out, logEntryJSON{Timestamp: at.UTC(), Level: e.Level, Message: e.Message, Fields: fields})
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": out})
}

// logLineJSON is E2B's SandboxLog: one entry as a line of text.
type logLineJSON struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// logsV1 answers GET /sandboxes/{id}/logs?start&limit, E2B's older route,
// which the e2b CLI still reads: the entries from start (Unix
// milliseconds) on, oldest first, both as lines and as structured
// entries (E2B's SandboxLogs).
func (s *Handler) logsV1(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	limit, ok := logLimit(w, q)
	if !ok {
		return
	}
	start, ok := unixMillis(w, q, "start")
	if !ok {
		return
	}
	entries, err := s.cfg.Cluster.Logs(r.Context(), id)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Timestamp.AsTime().Before(entries[j].Timestamp.AsTime()) })
	lines, structured := []logLineJSON{}, []logEntryJSON{}
	for _, e := range entries {
		at := e.Timestamp.AsTime().UTC()
		if at.Before(start) {
			continue
		}
		if len(lines) == limit {
			break
		}
		fields := e.Fields
		if fields == nil {
			fields = map[string]string{}
		}
		lines = append(lines, logLineJSON{Timestamp: at, Line: logLine(e, fields)})
		structured = append(structured, logEntryJSON{Timestamp: at, Level: e.Level, Message: e.Message, Fields: fields})
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": lines, "logEntries": structured})
}

// logLine renders an entry as E2B's lines are: one JSON object, which the
// e2b CLI parses for its level and logger and prints whole.
func logLine(e *nodev1.LogEntry, fields map[string]string) string {
	obj := make(map[string]string, len(fields)+3)
	for k, v := range fields {
		obj[k] = v
	}
	obj["level"], obj["message"] = e.Level, e.Message
	if obj["logger"] == "" {
		obj["logger"] = "aenv"
	}
	b, _ := json.Marshal(obj) // a map of strings always encodes
	return string(b)
}

func matchesLog(e *nodev1.LogEntry, search string) bool {
	if strings.Contains(strings.ToLower(e.Message), search) {
		return true
	}
	for k, v := range e.Fields {
		if strings.Contains(strings.ToLower(k+"="+v), search) {
			return true
		}
	}
	return false
}

// metricsJSONFrom is E2B's SandboxMetric of one sample.
func metricsJSONFrom(m *nodev1.MetricSample) metricJSON {
	at := m.Timestamp.AsTime().UTC()
	return metricJSON{Timestamp: at, TimestampUnix: at.Unix(), CPUCount: int(m.CpuCount), CPUUsedPct: m.CpuUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
}

// metrics answers GET /sandboxes/{id}/metrics?start&end (Unix seconds):
// the samples its node took (every 5 s for the last hour, every minute
// for the day before), oldest first.
func (s *Handler) metrics(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	bound := func(name string) (time.Time, bool) {
		v := q.Get(name)
		if v == "" {
			return time.Time{}, true
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be a time in Unix seconds, got %q", name, v))
			return time.Time{}, false
		}
		return time.Unix(n, 0), true
	}
	start, ok := bound("start")
	if !ok {
		return
	}
	end, ok := bound("end")
	if !ok {
		return
	}
	samples, err := s.cfg.Cluster.Metrics(r.Context(), id)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	sort.SliceStable(samples, func(i, j int) bool { return samples[i].Timestamp.AsTime().Before(samples[j].Timestamp.AsTime()) })
	out := []metricJSON{}
	for _, m := range samples {
		at := m.Timestamp.AsTime()
		if !start.IsZero() && at.Before(start) || !end.IsZero() && at.After(end) {
			continue
		}
		out = append(out, metricsJSONFrom(m))
	}
	writeJSON(w, http.StatusOK, out)
}

// maxMetricsIDs bounds GET /sandboxes/metrics?sandbox_ids=.
const maxMetricsIDs = 100

// metricsOfMany answers GET /sandboxes/metrics?sandbox_ids=a,b: the
// latest sample of each running sandbox named.
func (s *Handler) metricsOfMany(w http.ResponseWriter, r *http.Request) {
	var ids []string
	for _, v := range r.URL.Query()["sandbox_ids"] {
		for _, id := range strings.Split(v, ",") {
			if id = strings.TrimSpace(id); id != "" {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 || len(ids) > maxMetricsIDs {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sandbox_ids must name 1 to %d sandboxes, got %d", maxMetricsIDs, len(ids)))
		return
	}
	out := map[string]metricJSON{}
	o := owner(r)
	for _, id := range ids {
		if !sandboxIDPattern.MatchString(id) || len(id) > 64 {
			writeError(w, http.StatusBadRequest, "invalid sandbox id in sandbox_ids: ids match ^[a-z0-9]+$")
			return
		}
		// Another team's sandbox is left out, as one that ended.
		if sb, err := s.cfg.Cluster.Get(r.Context(), id); err != nil || !o.Sees(sb.TeamID()) {
			continue
		}
		samples, err := s.cfg.Cluster.Metrics(r.Context(), id)
		if err != nil || len(samples) == 0 {
			continue // ended, or not yet sampled: E2B leaves it out too
		}
		out[id] = metricsJSONFrom(samples[len(samples)-1])
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
}

// updateNetwork answers PUT /sandboxes/{id}/network: the rules given
// replace the sandbox's (what is left out is cleared, as on E2B).
func (s *Handler) updateNetwork(w http.ResponseWriter, r *http.Request, id string) {
	var body struct {
		networkBody
		AllowInternetAccess *bool `json:"allow_internet_access"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if body.AllowPublicTraffic != nil {
		sb, err := s.cfg.Cluster.Get(r.Context(), id)
		if err != nil {
			s.writeClusterError(w, r, err)
			return
		}
		if *body.AllowPublicTraffic != (sb.TrafficAccessToken == "") {
			writeError(w, http.StatusBadRequest, "allowPublicTraffic cannot change after the create (the SDK holds the traffic token it was given)")
			return
		}
	}
	rules := body.rules()
	rules.AllowInternet = body.AllowInternetAccess
	if _, err := s.cfg.Cluster.UpdateNetwork(r.Context(), id, rules); err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// logLimit is a logs route's limit parameter (default and bound:
// maxLogLimit); false when w was answered 400.
func logLimit(w http.ResponseWriter, q url.Values) (int, bool) {
	v := q.Get("limit")
	if v == "" {
		return maxLogLimit, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxLogLimit {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be between 0 and %d, got %q", maxLogLimit, v))
		return 0, false
	}
	return n, true
}

// unixMillis is the time parameter name in Unix milliseconds (zero when
// absent); false when w was answered 400.
func unixMillis(w http.ResponseWriter, q url.Values, name string) (time.Time, bool) {
	v := q.Get(name)
	if v == "" {
		return time.Time{}, true
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be a time in Unix milliseconds, got %q", name, v))
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
