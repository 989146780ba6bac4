// Package api serves aenv's HTTP control plane: the E2B-compatible REST
// routes (so the unmodified E2B SDKs work) and aenv's own extensions. It
// authenticates callers, validates input, maps the cluster's errors to
// `{code, message}` JSON with the right status, and hands sandbox traffic to
// the proxy. Only the server wiring (package server) imports it.
package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/prometheus/client_golang/prometheus"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/apikeys"
	"github.com/aenvhq/aenv/internal/buildjob"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/proxy"
	"github.com/aenvhq/aenv/internal/template"
)

// MaxBodyBytes bounds control-plane request bodies.
const MaxBodyBytes = 1 << 20

// MaxUploadBytes bounds a template build's file upload (a COPY's files).
const MaxUploadBytes = 4 << 30

// Config wires the API.
type Config struct {
	// Metrics, when set, adds to what /metrics serves (the local node's
	// warm pool and image server's figures).
	Metrics   prometheus.Gatherer
	Cluster   *cluster.Cluster
	Templates *template.Catalog
	// Proxy serves requests addressed to a sandbox.
	Proxy http.Handler
	// Keys are the cluster's API keys (clients send one in X-API-KEY),
	// which the /keys routes manage; nil answers those routes 501.
	Keys *apikeys.Keys
	// APIKey, if set, is accepted as an admin key besides Keys (a server
	// without a cluster's key store, and tests).
	APIKey string
	// RateLimit bounds control-plane requests per client address per
	// second (burst: RateBurst); 0 disables the limit.
	RateLimit float64
	RateBurst int
	// Domain is reported to clients: sandbox hosts are
	// `<port>-<id>.<Domain>`.
	Domain string
	// ProxyRateLimit and ProxyRateBurst bound the requests to each
	// sandbox through the proxy (per second; 0 disables). Lookups of
	// sandboxes the cluster does not hold in memory are limited per client
	// address besides (see guardProxy).
	ProxyRateLimit float64
	ProxyRateBurst int
	// TrustedProxies are the addresses of proxies in front of the server
	// whose X-Forwarded-For names the client, for the rate limit.
	TrustedProxies []netip.Prefix
	// AllowInsecure lets sandboxes be created without an envd access
	// token when the client does not ask for one (secure: false); by
	// default every sandbox gets one.
	AllowInsecure bool
	// BodyTimeout bounds how long a control-plane request may take to send
	// its body (uploads excepted, which get UploadTimeout), so that slow
	// clients cannot hold connections open; 0 means 30 s.
	BodyTimeout time.Duration
	// UploadTimeout bounds the body of an upload (template pulls, builds
	// and build files); 0 means an hour.
	UploadTimeout time.Duration
	// Builds keeps the cluster's template builds and runs those started
	// here on a node (its team bounds, Limiter, included); nil answers
	// the build routes 501.
	Builds *buildjob.Jobs
	// Pulls enables POST /templates/pulls (a server whose templates reach
	// its nodes: a local node, or a store they share). Pulls are build
	// jobs (Builds) that nodes run, under the nodes' bounds.
	Pulls bool
	// VolumeContent serves the data plane of volumes on node nodeID (the
	// local node's files, or a proxy to the node); nil disables volumes'
	// data plane.
	VolumeContent func(nodeID string) (http.Handler, error)
	Logger        *slog.Logger
}

// Handler serves the API and, in front of it, the proxy to sandboxes.
type Handler struct {
	cfg   Config
	log   *slog.Logger
	mux   *http.ServeMux
	api   http.Handler // mux behind the rate limit
	proxy http.Handler // cfg.Proxy behind its rate limit
	// routeList is every route registered, with who may call it.
	routeList []Route
	// builds runs template builds and keeps their uploads.
	builds *builds
	// counts are what /metrics says of the API's own work.
	counts *apiMetrics
	// signIns bounds the web console's sign-ins (LimitSignIn).
	signIns *rateLimiter
}

// New builds the API handler.
func New(cfg Config) *Handler {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 30 * time.Second
	}
	if cfg.UploadTimeout <= 0 {
		cfg.UploadTimeout = time.Hour
	}
	s := &Handler{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), counts: newAPIMetrics(),
		signIns: newRateLimiter(signInRate, signInBurst)}
	s.routes()
	s.api = s.mux
	if cfg.RateLimit > 0 {
		s.api = newRateLimiter(cfg.RateLimit, max(cfg.RateBurst, 1)).limit(s.mux, s.clientKey)
	}
	s.api = s.countRequests(s.api)
	if cfg.Proxy != nil {
		s.proxy = s.guardProxy(cfg.Proxy)
	}
	return s
}

// Access says who may call a route.
type Access string

// Accesses.
const (
	// Public routes need no key.
	Public Access = "public"
	// Team routes need a key and act only on what its team owns (an
	// admin key's: on anything); each handler checks the resources it
	// names, and the server's TestRoutesCheckTeams proves it for every
	// team route.
	Team Access = "team"
	// AdminOnly routes need an admin key.
	AdminOnly Access = "admin"
)

const (
	public    = Public
	team      = Team
	adminOnly = AdminOnly
)

// Route is one registered route, kept so that tests can enumerate them.
type Route struct {
	Pattern string
	Access  Access
}

// Routes returns every route the API serves, with who may call it.
func (s *Handler) Routes() []Route { return slices.Clone(s.routeList) }

// handle registers h for pattern behind the access check.
func (s *Handler) handle(pattern string, a Access, h http.HandlerFunc) {
	s.routeList = append(s.routeList, Route{Pattern: pattern, Access: a})
	switch a {
	case public:
		s.mux.Handle(pattern, h)
	case team:
		s.mux.Handle(pattern, s.auth(h))
	case adminOnly:
		s.mux.Handle(pattern, s.admin(h))
	}
}

func (s *Handler) routes() {
	s.handle("GET /health", public, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })

	s.handle("POST /sandboxes", team, s.createSandbox(defaultTimeoutV1))
	s.handle("POST /v2/sandboxes", team, s.createSandbox(defaultTimeoutV2))
	s.handle("POST /sandboxes/batch", team, s.createBatch)
	s.handle("GET /sandboxes", team, s.listSandboxesV1)
	s.handle("GET /v2/sandboxes", team, s.listSandboxesV2)
	s.handle("GET /sandboxes/{id}", team, s.withID(s.getSandbox))
	s.handle("DELETE /sandboxes/{id}", team, s.withID(s.killSandbox))
	s.handle("POST /sandboxes/{id}/timeout", team, s.withID(s.setTimeout))
	s.handle("POST /sandboxes/{id}/refreshes", team, s.withID(s.refresh))
	s.handle("POST /sandboxes/{id}/connect", team, s.withID(s.connect))
	s.handle("POST /v2/sandboxes/{id}/connect", team, s.withID(s.connect))
	s.handle("POST /sandboxes/{id}/resume", team, s.withID(s.connect))
	s.handle("POST /sandboxes/{id}/pause", team, s.withID(s.pause))
	s.handle("PUT /sandboxes/{id}/network", team, s.withID(s.updateNetwork))
	s.handle("GET /sandboxes/{id}/metrics", team, s.withID(s.metrics))
	s.handle("GET /sandboxes/metrics", team, s.metricsOfMany)
	s.handle("GET /sandboxes/{id}/logs", team, s.withID(s.logsV1))
	s.handle("GET /v2/sandboxes/{id}/logs", team, s.withID(s.logsV2))

	s.handle("POST /sandboxes/{id}/snapshots", team, s.withID(s.createSnapshot))
	s.handle("POST /sandboxes/{id}/fork", team, s.withID(s.fork))
	s.handle("POST /sandboxes/{id}/migrate", team, s.withID(s.migrate))
	s.handle("GET /snapshots", team, s.listSnapshots)
	s.handle("GET /snapshots/{snapshotID}", team, s.getSnapshot)
	s.handle("DELETE /templates/{templateID}", team, s.deleteTemplate)

	s.handle("GET /metrics", adminOnly, s.metricsHandler().ServeHTTP)
	s.handle("GET /nodes", adminOnly, s.listNodes)
	s.handle("GET /nodes/{nodeID}", adminOnly, withNodeID(s.getNode))
	s.handle("POST /nodes/{nodeID}/drain", adminOnly, withNodeID(s.drainNode))
	s.handle("DELETE /nodes/{nodeID}/drain", adminOnly, withNodeID(s.drainNode))
	s.handle("GET /keys", adminOnly, s.listKeys)
	s.handle("POST /keys", adminOnly, s.createKey)
	s.handle("DELETE /keys/{keyID}", adminOnly, s.revokeKey)
	s.handle("GET /teams", team, s.listTeams)
	s.handle("POST /teams", adminOnly, s.createTeam)
	s.handle("GET /teams/{teamID}", team, s.getTeam)
	s.handle("PATCH /teams/{teamID}", adminOnly, s.setTeam)

	s.handle("POST /volumes", team, s.createVolume)
	s.handle("GET /volumes", team, s.listVolumes)
	s.handle("GET /volumes/{volumeID}", team, s.getVolume)
	s.handle("DELETE /volumes/{volumeID}", team, s.deleteVolume)

	s.handle("GET /templates", team, s.listTemplates)
	s.handle("GET /templates/usage", adminOnly, s.templateUsage)
	s.handle("PATCH /templates/{templateID}", adminOnly, s.patchTemplate)
	s.handle("POST /templates/pulls", team, s.pullTemplate)
	s.handle("POST /templates/builds", team, s.buildTemplate)
	s.handle("GET /templates/aliases/{alias}", team, s.getTemplateAlias)
	b := newBuilds(s)
	s.builds = b
	s.handle("POST /v3/templates", team, b.request)
	s.handle("POST /v2/templates/{templateID}/builds/{buildID}", team, b.start)
	s.handle("GET /templates/{templateID}/builds/{buildID}/status", team, b.status)
	s.handle("GET /templates/{templateID}/builds/{buildID}/logs", team, b.logs)
	s.handle("GET /templates/{templateID}/files/{hash}", team, b.files)
	s.handle("PUT /templates/{templateID}/files/{hash}", team, b.upload)

	s.handle("/", public, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
}

// ServeHTTP sends sandbox traffic to the proxy and the rest to the API.
func (s *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := proxy.Match(r); ok && s.proxy != nil {
		s.proxy.ServeHTTP(w, r)
		return
	}
	limit, timeout := int64(MaxBodyBytes), s.cfg.BodyTimeout
	next := s.api
	if strings.HasPrefix(r.URL.Path, "/volumecontent/") {
		// Authorised by the volume's own token, not an API key; files
		// are as large as uploads.
		limit, timeout = MaxUploadBytes, s.cfg.UploadTimeout
		next = http.HandlerFunc(s.volumeContent)
	}
	if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/templates/") && strings.Contains(r.URL.Path, "/files/") ||
		r.Method == http.MethodPost && (r.URL.Path == "/templates/pulls" || r.URL.Path == "/templates/builds") {
		limit, timeout = MaxUploadBytes, s.cfg.UploadTimeout
	}
	// The deadline covers reading the body only; answers (event streams
	// included) may take as long as they take. It must go once the body
	// is read: net/http then watches the connection for the client
	// leaving, and a deadline passing there cancels the request as if it
	// had (a followed build log, a batch create, cut at BodyTimeout).
	if r.Body != nil && r.Body != http.NoBody {
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(timeout))
		r.Body = &deadlineBody{ReadCloser: http.MaxBytesReader(w, r.Body, limit), rc: rc}
	}
	next.ServeHTTP(w, r)
}

// deadlineBody is a request body whose read deadline is lifted at its
// end.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	cleared bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.cleared {
		b.cleared = true
		_ = b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// keyContext carries the caller's key to handlers.
type keyContext struct{}

// lookupKey finds the key a request presents. The static key is compared
// in constant time so that it cannot be guessed byte by byte from
// response timings; stored keys are found by their hash.
func (s *Handler) lookupKey(r *http.Request) (apikeys.Key, bool) {
	if k, ok := r.Context().Value(sessionContext{}).(apikeys.Key); ok {
		return k, true
	}
	key := requestKey(r)
	if key == "" {
		return apikeys.Key{}, false
	}
	if s.cfg.APIKey != "" && subtle.ConstantTimeCompare([]byte(key), []byte(s.cfg.APIKey)) == 1 {
		return apikeys.Key{ID: "server", Name: "server", Team: "server", Admin: true}, true
	}
	if s.cfg.Keys != nil {
		return s.cfg.Keys.Lookup(key)
	}
	return apikeys.Key{}, false
}

// sessionContext carries the key of a session checked in front of the
// API (WithCaller).
type sessionContext struct{}

// WithCaller returns r authenticated as key k, as though it had presented
// it: every route then applies k's team and admin rules, exactly as for
// the key itself. It is for the web console's sessions, which the server
// wiring checks (cookie, expiry, CSRF token, the key not revoked) before
// the API sees the request; a request's own X-API-KEY is not consulted.
func WithCaller(r *http.Request, k apikeys.Key) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), sessionContext{}, k))
}

// auth demands a valid API key and hands it to next in the context.
func (s *Handler) auth(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, ok := s.lookupKey(r)
		if !ok {
			writeError(w, http.StatusUnauthorized, "invalid or missing API key (send it in the X-API-KEY header)")
			return
		}
		next(w, r.WithContext(context.WithValue(r.Context(), keyContext{}, k)))
	})
}

// admin demands an admin key.
func (s *Handler) admin(next http.HandlerFunc) http.Handler {
	return s.auth(func(w http.ResponseWriter, r *http.Request) {
		if !callerKey(r).Admin {
			writeError(w, http.StatusForbidden, "this needs an admin API key")
			return
		}
		next(w, r)
	})
}

// callerKey is the key auth accepted for r.
func callerKey(r *http.Request) apikeys.Key {
	k, _ := r.Context().Value(keyContext{}).(apikeys.Key)
	return k
}

// requestKey is the API key a request presents, if any.
func requestKey(r *http.Request) string {
	if key := r.Header.Get("X-API-Key"); key != "" {
		return key
	}
	key, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return key
}

var sandboxIDPattern = regexp.MustCompile(`^[a-z0-9]{1,64}$`)

// withID validates the {id} path segment before the handler sees it (ids
// end up in paths on the node, so anything but [a-z0-9] is refused here)
// and checks that the caller's team owns the sandbox.
func (s *Handler) withID(next func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !sandboxIDPattern.MatchString(id) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid sandbox id %q: ids match ^[a-z0-9]+$", id))
			return
		}
		if s.ownSandbox(w, r, id) {
			next(w, r, id)
		}
	}
}

// apiError is E2B's error body.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, apiError{Code: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// clusterStatus is the HTTP status of one of the cluster's error classes;
// this is the only place where they become HTTP.
func clusterStatus(err error) int {
	switch {
	case errors.Is(err, cluster.ErrNotFound), errors.Is(err, cluster.ErrTemplateNotFound), errors.Is(err, cluster.ErrVolumeNotFound):
		return http.StatusNotFound
	case errors.Is(err, cluster.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, cluster.ErrConflict), errors.Is(err, cluster.ErrIdempotencyConflict):
		return http.StatusConflict
	case errors.Is(err, cluster.ErrUnsupported):
		return http.StatusNotImplemented
	case errors.Is(err, cluster.ErrNoCapacity), errors.Is(err, cluster.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, cluster.ErrQuota):
		return http.StatusTooManyRequests
	default:
		return http.StatusInternalServerError
	}
}

// writeClusterError answers with err's status and message.
func (s *Handler) writeClusterError(w http.ResponseWriter, r *http.Request, err error) {
	code := clusterStatus(err)
	msg := err.Error()
	switch {
	case errors.Is(err, cluster.ErrNoCapacity):
		w.Header().Set("Retry-After", "5")
	case errors.Is(err, cluster.ErrUnavailable):
		// Running sandboxes keep running; only changes wait for the store.
		w.Header().Set("Retry-After", "2")
		s.log.Warn("state store unavailable", "method", r.Method, "path", r.URL.Path, "err", err)
		msg = "the state store is unavailable; try again shortly: " + msg
	case code == http.StatusInternalServerError:
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeError(w, code, msg)
}

// decodeBody reads a JSON body into v. An empty body leaves v as it is.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return true
	}
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON object")
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
			return false
		}
		writeError(w, http.StatusBadRequest, "malformed JSON body: "+err.Error())
		return false
	}
	return true
}
