package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/template"
)

// maxIdempotencyKey bounds a create's Idempotency-Key header.
const maxIdempotencyKey = 256

// E2B's defaults for a create without a timeout.
const (
	defaultTimeoutV1 = 15 * time.Second
	defaultTimeoutV2 = 300 * time.Second
)

// createBody is E2B's NewSandbox. Fields the SDK sends that aenv does not
// act on yet (mcp, egress rules, volumes) are accepted and ignored.
type createBody struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  bool              `json:"autoPause"`
	// AutoPauseMemory false makes the timeout\'s pause keep only files.
	AutoPauseMemory *bool `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	Secure              bool         `json:"secure"`
	AllowInternetAccess *bool        `json:"allow_internet_access"`
	CPUCount            int          `json:"cpuCount"`
	MemoryMB            int          `json:"memoryMB"`
	Network             *networkBody `json:"network"`
	// VolumeMounts is [{name, path}] or {path: name}.
	VolumeMounts json.RawMessage `json:"volumeMounts"`
}

// networkBody is E2B's network settings of a sandbox.
type networkBody struct {
	AllowPublicTraffic *bool    `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut"`
	DenyOut            []string `json:"denyOut"`
	MaskRequestHost    *string  `json:"maskRequestHost"`
}

// rules is the part of n the cluster enforces past the create.
func (n *networkBody) rules() cluster.NetworkRules {
	if n == nil {
		return cluster.NetworkRules{}
	}
	r := cluster.NetworkRules{AllowOut: n.AllowOut, DenyOut: n.DenyOut}
	if n.MaskRequestHost != nil {
		r.MaskRequestHost = *n.MaskRequestHost
	}
	return r
}

// networkJSON is E2B's SandboxNetworkConfig in sandbox details.
type networkJSON struct {
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	MaskRequestHost    string   `json:"maskRequestHost,omitempty"`
}

// sandboxJSON is E2B's Sandbox / SandboxDetail / ListedSandbox in one.
type sandboxJSON struct {
	SandboxID          string            `json:"sandboxID"`
	TemplateID         string            `json:"templateID"`
	Alias              string            `json:"alias,omitempty"`
	ClientID           string            `json:"clientID"`
	StartedAt          *time.Time        `json:"startedAt,omitempty"`
	EndAt              *time.Time        `json:"endAt,omitempty"`
	State              string            `json:"state,omitempty"`
	CPUCount           int               `json:"cpuCount,omitempty"`
	MemoryMB           int               `json:"memoryMB,omitempty"`
	DiskSizeMB         int               `json:"diskSizeMB"`
	EnvdVersion        string            `json:"envdVersion"`
	EnvdAccessToken    *string           `json:"envdAccessToken"`
	TrafficAccessToken *string           `json:"trafficAccessToken"`
	Metadata           map[string]string `json:"metadata,omitempty"`
	Domain             string            `json:"domain,omitempty"`
	// NodeID (an aenv extension) is the node the sandbox runs or was
	// paused on.
	NodeID string `json:"nodeID,omitempty"`
	// IdlePaused (an aenv extension): the platform paused it for being
	// idle (--idle-pause); its next request resumes it.
	IdlePaused bool           `json:"idlePaused,omitempty"`
	Lifecycle  *lifecycleJSON `json:"lifecycle,omitempty"`
	Network    *networkJSON   `json:"network,omitempty"`
}

// lifecycleJSON is E2B's SandboxLifecycle: what a timeout does.
type lifecycleJSON struct {
	OnTimeout  string `json:"onTimeout"`
	AutoResume bool   `json:"autoResume"`
}

func (s *Handler) toJSON(sb *cluster.Sandbox, detail bool) sandboxJSON {
	out := sandboxJSON{
		SandboxID:   sb.ID,
		TemplateID:  sb.TemplateID,
		Alias:       sb.Alias,
		ClientID:    sb.ClientID(),
		DiskSizeMB:  sb.DiskMB,
		EnvdVersion: sb.EnvdVersion,
		Domain:      s.cfg.Domain,
		NodeID:      sb.NodeID,
	}
	if sb.EnvdAccessToken != "" {
		tok := sb.EnvdAccessToken
		out.EnvdAccessToken = &tok
	}
	if sb.TrafficAccessToken != "" {
		tok := sb.TrafficAccessToken
		out.TrafficAccessToken = &tok
	}
	if detail {
		start, end := sb.StartedAt.UTC(), sb.EndAt.UTC()
		// E2B keeps an end time on paused sandboxes too; ours is when it
		// was paused, since a paused sandbox has no deadline.
		out.StartedAt, out.EndAt = &start, &end
		out.State = string(sb.State)
		out.IdlePaused = sb.IdlePaused && sb.State == cluster.StatePaused
		out.CPUCount, out.MemoryMB = sb.CPUCount, sb.MemoryMB
		out.Metadata = sb.Metadata
		if out.Metadata == nil {
			out.Metadata = map[string]string{}
		}
		out.Network = &networkJSON{AllowPublicTraffic: sb.TrafficAccessToken == "", AllowOut: sb.Network.AllowOut,
			DenyOut: sb.Network.DenyOut, MaskRequestHost: sb.Network.MaskRequestHost}
		out.Lifecycle = &lifecycleJSON{OnTimeout: "kill", AutoResume: sb.AutoResume}
		if sb.AutoPause {
			out.Lifecycle.OnTimeout = "pause"
		}
	}
	return out
}

func (s *Handler) createSandbox(defaultTimeout time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body createBody
		if !decodeBody(w, r, &body) {
			return
		}
		req, ok := s.createRequest(w, r, &body, defaultTimeout)
		if !ok {
			return
		}
		idem := r.Header.Get("Idempotency-Key")
		if len(idem) > maxIdempotencyKey {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("Idempotency-Key is %d bytes; at most %d", len(idem), maxIdempotencyKey))
			return
		}
		req.IdempotencyKey = idem
		sb, err := s.create(r.Context(), req)
		if err != nil {
			s.writeClusterError(w, r, err)
			return
		}
		writeJSON(w, http.StatusCreated, s.toJSON(sb, false))
	}
}

// createRequest checks a create's body and resolves its template for the
// caller, answering w itself when it cannot (false).
func (s *Handler) createRequest(w http.ResponseWriter, r *http.Request, body *createBody, defaultTimeout time.Duration) (cluster.CreateRequest, bool) {
	if body.TemplateID == "" {
		body.TemplateID = template.BaseID
	}
	if !template.ValidID(body.TemplateID) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid templateID %q", body.TemplateID))
		return cluster.CreateRequest{}, false
	}
	timeout := defaultTimeout
	if body.Timeout != nil {
		t := *body.Timeout
		max := int64(s.cfg.Cluster.Limits().MaxTimeout / time.Second)
		if t < 0 || t > max {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout must be between 0 and %d seconds, got %d", max, t))
			return cluster.CreateRequest{}, false
		}
		if t > 0 {
			timeout = time.Duration(t) * time.Second
		}
	}
	mounts, err := parseVolumeMounts(body.VolumeMounts)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return cluster.CreateRequest{}, false
	}
	allowInternet := true
	if body.AllowInternetAccess != nil {
		allowInternet = *body.AllowInternetAccess
	}
	tmpl, snapID, err := s.resolveCreate(r.Context(), owner(r), body.TemplateID)
	if err != nil {
		s.writeClusterError(w, r, err)
		return cluster.CreateRequest{}, false
	}
	return cluster.CreateRequest{
		Spec: cluster.Spec{
			Timeout:            timeout,
			Metadata:           body.Metadata,
			AllowInternet:      allowInternet,
			Secure:             body.Secure || !s.cfg.AllowInsecure,
			AutoPause:          body.AutoPause,
			AutoPauseFilesOnly: body.AutoPauseMemory != nil && !*body.AutoPauseMemory,
			AutoResume:         body.AutoResume != nil && body.AutoResume.Enabled,
			CPUCount:           body.CPUCount,
			MemoryMB:           body.MemoryMB,
			Mounts:             mounts,
			Network:            body.Network.rules(),
			PrivateTraffic: body.Network != nil && body.Network.AllowPublicTraffic != nil &&
				!*body.Network.AllowPublicTraffic,
		},
		TemplateID: tmpl,
		SnapshotID: snapID,
		Requested:  body.TemplateID,
		EnvVars:    body.EnvVars,
		Owner:      owner(r),
	}, true
}

func (s *Handler) getSandbox(w http.ResponseWriter, r *http.Request, id string) {
	sb, err := s.cfg.Cluster.Get(r.Context(), id)
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.toJSON(sb, true))
}

func (s *Handler) killSandbox(w http.ResponseWriter, r *http.Request, id string) {
	if err := s.cfg.Cluster.Kill(r.Context(), id); err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody carries {timeout: seconds}; refreshes use {duration}.
type timeoutBody struct {
	Timeout  *int64 `json:"timeout"`
	Duration *int64 `json:"duration"`
	// Memory false (connect) resumes by booting afresh with the files.
	Memory *bool `json:"memory"`
}

func (s *Handler) readSeconds(w http.ResponseWriter, r *http.Request, field string, required bool, def time.Duration) (time.Duration, bool) {
	d, _, ok := s.readTimeoutBody(w, r, field, required, def)
	return d, ok
}

// readTimeoutBody is readSeconds that also returns the body.
func (s *Handler) readTimeoutBody(w http.ResponseWriter, r *http.Request, field string, required bool, def time.Duration) (time.Duration, timeoutBody, bool) {
	var body timeoutBody
	if !decodeBody(w, r, &body) {
		return 0, body, false
	}
	v := body.Timeout
	if field == "duration" {
		v = body.Duration
	}
	if v == nil {
		if required {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s (seconds) is required", field))
			return 0, body, false
		}
		return def, body, true
	}
	max := int64(s.cfg.Cluster.Limits().MaxTimeout / time.Second)
	if *v <= 0 || *v > max {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be between 1 and %d seconds, got %d", field, max, *v))
		return 0, body, false
	}
	return time.Duration(*v) * time.Second, body, true
}

func (s *Handler) setTimeout(w http.ResponseWriter, r *http.Request, id string) {
	d, ok := s.readSeconds(w, r, "timeout", true, 0)
	if !ok {
		return
	}
	if _, err := s.cfg.Cluster.SetTimeout(r.Context(), id, d); err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Handler) refresh(w http.ResponseWriter, r *http.Request, id string) {
	d, ok := s.readSeconds(w, r, "duration", false, defaultTimeoutV1)
	if !ok {
		return
	}
	if _, err := s.cfg.Cluster.Refresh(r.Context(), id, d); err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Handler) connect(w http.ResponseWriter, r *http.Request, id string) {
	d, body, ok := s.readTimeoutBody(w, r, "timeout", false, defaultTimeoutV2)
	if !ok {
		return
	}
	sb, resumed, err := s.cfg.Cluster.ConnectWith(r.Context(), id, d, cluster.ConnectOptions{Reboot: body.Memory != nil && !*body.Memory})
	if err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.toJSON(sb, false))
}

func (s *Handler) pause(w http.ResponseWriter, r *http.Request, id string) {
	var body struct {
		// Memory false keeps only the files (E2B's keepMemory: false).
		Memory *bool `json:"memory"`
	}
	if !decodeBody(w, r, &body) {
		return
	}
	if err := s.cfg.Cluster.PauseWith(r.Context(), id, cluster.PauseOptions{FilesOnly: body.Memory != nil && !*body.Memory}); err != nil {
		s.writeClusterError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// listSandboxesV1 is the old list: running sandboxes, optional metadata
// filter, no paging.
func (s *Handler) listSandboxesV1(w http.ResponseWriter, r *http.Request) {
	filter, ok := parseListFilter(w, r)
	if !ok {
		return
	}
	out := []sandboxJSON{}
	for _, sb := range s.cfg.Cluster.List(filter) {
		out = append(out, s.toJSON(sb, true))
	}
	writeJSON(w, http.StatusOK, out)
}

const maxListLimit = 100

// listSandboxesV2 adds state filters and paging through X-Next-Token.
func (s *Handler) listSandboxesV2(w http.ResponseWriter, r *http.Request) {
	filter, ok := parseListFilter(w, r)
	if !ok {
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed query string: "+err.Error())
		return
	}
	limit, ok := parseLimit(w, q)
	if !ok {
		return
	}
	var after pageKey
	if tok := q.Get("nextToken"); tok != "" {
		k, err := decodePageKey(tok)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid nextToken")
			return
		}
		after = k
	}
	all := s.cfg.Cluster.List(filter)
	out := []sandboxJSON{}
	for i, sb := range all {
		if !after.before(sb) {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", encodePageKey(all[i-1]))
			break
		}
		out = append(out, s.toJSON(sb, true))
	}
	writeJSON(w, http.StatusOK, out)
}

// parseLimit reads the page size of a list request.
func parseLimit(w http.ResponseWriter, q url.Values) (int, bool) {
	v := q.Get("limit")
	if v == "" {
		return maxListLimit, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxListLimit {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be between 1 and %d", maxListLimit))
		return 0, false
	}
	return n, true
}

// parseListFilter reads a list's filters; a non-admin key lists its own
// team's sandboxes only, an admin's every team's or those of ?team=.
func parseListFilter(w http.ResponseWriter, r *http.Request) (cluster.ListFilter, bool) {
	var f cluster.ListFilter
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		writeError(w, http.StatusBadRequest, "malformed query string: "+err.Error())
		return f, false
	}
	if o := owner(r); !o.Admin {
		f.Teams = []string{o.Team}
	} else if t := q.Get("team"); t != "" {
		f.Teams = strings.Split(t, ",")
	}
	if md := q.Get("metadata"); md != "" {
		vals, err := url.ParseQuery(md)
		if err != nil {
			writeError(w, http.StatusBadRequest, "metadata must be url-encoded key=value pairs")
			return f, false
		}
		f.Metadata = map[string]string{}
		for k, v := range vals {
			// The E2B SDKs encode each key and value before encoding the
			// whole parameter, so undo that layer too.
			f.Metadata[unescapeOnce(k)] = unescapeOnce(v[len(v)-1])
		}
	}
	for _, st := range q["state"] {
		for _, one := range strings.Split(st, ",") {
			switch cluster.State(one) {
			case cluster.StateRunning, cluster.StatePaused:
				f.States = append(f.States, cluster.State(one))
			default:
				writeError(w, http.StatusBadRequest, fmt.Sprintf("unknown state %q (running, paused)", one))
				return f, false
			}
		}
	}
	return f, true
}

func unescapeOnce(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}

// pageKey is the position after which the next page starts, in the
// cluster's list order (start time, then id).
type pageKey struct {
	startedAt time.Time
	id        string
}

func (k pageKey) before(sb *cluster.Sandbox) bool {
	if k.id == "" {
		return true
	}
	if !sb.StartedAt.Equal(k.startedAt) {
		return sb.StartedAt.After(k.startedAt)
	}
	return sb.ID > k.id
}

func encodePageKey(sb *cluster.Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(sb.StartedAt.Format(time.RFC3339Nano) + "|" + sb.ID))
}

func decodePageKey(tok string) (pageKey, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return pageKey{}, err
	}
	ts, id, ok := strings.Cut(string(b), "|")
	if !ok || !sandboxIDPattern.MatchString(id) {
		return pageKey{}, fmt.Errorf("malformed token")
	}
	t, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		return pageKey{}, err
	}
	return pageKey{startedAt: t, id: id}, nil
}

// metricJSON is one E2B SandboxMetric.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       uint64    `json:"memUsed"`
	MemTotal      uint64    `json:"memTotal"`
	MemCache      uint64    `json:"memCache"`
	DiskUsed      uint64    `json:"diskUsed"`
	DiskTotal     uint64    `json:"diskTotal"`
}
