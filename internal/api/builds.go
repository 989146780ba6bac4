package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/build"
	"github.com/aenvhq/aenv/internal/image"
	"github.com/aenvhq/aenv/internal/template"
)

// Build statuses, as E2B names them.
const (
	buildWaiting  = "waiting"
	buildBuilding = "building"
	buildReady    = "ready"
	buildError    = "error"
)

// builds runs E2B template builds: a template is requested (POST
// /v3/templates), then its build started with a step list (POST
// /v2/templates/{id}/builds/{buildID}) and polled. Builds are kept in
// memory: a restarted server forgets them, not the templates they made.
type builds struct {
	s  *Server
	mu sync.Mutex
	// byTemplate holds each template's latest build.
	byTemplate map[string]*buildRecord
	// filesInUse counts the running builds that use each upload.
	filesInUse map[string]int
}

func newBuilds(s *Server) *builds {
	return &builds{s: s, byTemplate: map[string]*buildRecord{}, filesInUse: map[string]int{}}
}

// buildRecord is one build and its log.
type buildRecord struct {
	templateID, buildID string
	// team owns the build and the template it makes.
	team               string
	cpuCount, memoryMB int
	names              []string

	mu     sync.Mutex
	status string
	// logs is the log's tail: logs[0] is entry number first (log offsets
	// count from the build's first line), logBytes their messages' size.
	logs     []buildLogEntry
	first    int
	logBytes int
	partial  []byte
	reason   *buildReason
}

// buildLogEntry is E2B's BuildLogEntry.
type buildLogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// buildReason is E2B's BuildStatusReason.
type buildReason struct {
	Message    string          `json:"message"`
	Step       string          `json:"step,omitempty"`
	LogEntries []buildLogEntry `json:"logEntries"`
}

// Write takes the build's output, a log entry per line; a line longer
// than maxLineBytes is cut into entries of that size.
func (b *buildRecord) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.partial = append(b.partial, p...)
	for {
		i := bytes.IndexByte(b.partial, '\n')
		if i < 0 {
			for len(b.partial) >= maxLineBytes {
				b.addLocked("info", string(b.partial[:maxLineBytes]))
				b.partial = b.partial[maxLineBytes:]
			}
			break
		}
		b.addLocked("info", string(b.partial[:i]))
		b.partial = b.partial[i+1:]
	}
	// Keep the unfinished line, not the whole buffer it was cut from.
	b.partial = append([]byte(nil), b.partial...)
	return len(p), nil
}

// A build's log is kept in memory while the server runs: its last
// maxLogBytes (of messages) in at most maxLogEntries entries. The oldest
// entries go first: the tail says why a build failed. A client that polls
// from an offset already dropped gets the tail from its start.
const (
	maxLogBytes   = 1 << 20
	maxLogEntries = 20000
	maxLineBytes  = 16 << 10
)

func (b *buildRecord) addLocked(level, msg string) {
	msg = strings.TrimRight(msg, "\r")
	b.logs = append(b.logs, buildLogEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg})
	b.logBytes += len(msg)
	for len(b.logs) > 1 && (b.logBytes > maxLogBytes || len(b.logs) > maxLogEntries) {
		b.logBytes -= len(b.logs[0].Message)
		b.logs[0] = buildLogEntry{} // let go of its message
		b.logs = b.logs[1:]
		b.first++
	}
}

// finish records how the build ended.
func (b *buildRecord) finish(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.partial) > 0 {
		b.addLocked("info", string(b.partial))
		b.partial = nil
	}
	if err == nil {
		b.status = buildReady
		return
	}
	b.status = buildError
	b.addLocked("error", err.Error())
	step := "finalize"
	var se *build.StepError
	if errors.As(err, &se) {
		step = strconv.Itoa(se.Step)
		if se.Step == 0 {
			step = "base"
		}
	}
	tail := b.logs[max(0, len(b.logs)-20):]
	b.reason = &buildReason{Message: err.Error(), Step: step, LogEntries: append([]buildLogEntry(nil), tail...)}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// requestBody is E2B's TemplateBuildRequestV3.
type requestBody struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"`
	Tags     []string `json:"tags"`
	CPUCount int      `json:"cpuCount"`
	MemoryMB int      `json:"memoryMB"`
}

// request answers POST /v3/templates: it names the template (its name is
// its id, as with `aenv pull --name`) and reserves a build.
func (bs *builds) request(w http.ResponseWriter, r *http.Request) {
	if bs.s.cfg.BuildSteps == nil {
		writeError(w, http.StatusNotImplemented, "template builds are not enabled on this server")
		return
	}
	var body requestBody
	if !decodeBody(w, r, &body) {
		return
	}
	name := body.Name
	if name == "" {
		name = body.Alias
	}
	tags := body.Tags
	if n, tag, ok := strings.Cut(name, ":"); ok {
		name, tags = n, append(tags, tag)
	}
	if name == "" {
		name = "tpl-" + randomHex(8)
	}
	if err := validTemplateName(name); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	tpl := newTemplate(r, name)
	if body.CPUCount < 0 || body.MemoryMB < 0 {
		writeError(w, http.StatusBadRequest, "cpuCount and memoryMB must not be negative")
		return
	}
	rec := &buildRecord{
		templateID: tpl.ID, team: tpl.Team, buildID: randomHex(16), status: buildWaiting,
		cpuCount: body.CPUCount, memoryMB: body.MemoryMB, names: []string{name},
	}
	bs.mu.Lock()
	if old := bs.byTemplate[tpl.ID]; old != nil {
		old.mu.Lock()
		busy := old.status == buildBuilding
		old.mu.Unlock()
		if busy {
			bs.mu.Unlock()
			writeError(w, http.StatusConflict, fmt.Sprintf("template %s is being built (build %s)", name, old.buildID))
			return
		}
	}
	bs.byTemplate[tpl.ID] = rec
	bs.mu.Unlock()
	if tags == nil {
		tags = []string{}
	}
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": rec.templateID, "buildID": rec.buildID, "public": false,
		"names": rec.names, "aliases": rec.names, "tags": tags,
	})
}

// byID finds the latest build of template id, or of the caller's team's
// template called id.
func (bs *builds) byID(r *http.Request, id string) *buildRecord {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if rec := bs.byTemplate[id]; rec != nil {
		return rec
	}
	return bs.byTemplate[teamTemplateID(callerKey(r).Team, id)]
}

// building checks that the {templateID} a files route names is a build
// the caller's team requested (POST /v3/templates comes first).
func (bs *builds) building(w http.ResponseWriter, r *http.Request) bool {
	id := r.PathValue("templateID")
	rec := bs.byID(r, id)
	if rec == nil || !owner(r).Sees(rec.team) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no build of template %s (request one with POST /v3/templates first)", id))
		return false
	}
	return true
}

// lookup finds the build a path names.
func (bs *builds) lookup(w http.ResponseWriter, r *http.Request) *buildRecord {
	id, buildID := r.PathValue("templateID"), r.PathValue("buildID")
	rec := bs.byID(r, id)
	if rec == nil || rec.buildID != buildID || !owner(r).Sees(rec.team) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("build %s of template %s not found", buildID, id))
		return nil
	}
	return rec
}

// startBody is E2B's TemplateBuildStartV2.
type startBody struct {
	FromImage         string         `json:"fromImage"`
	FromTemplate      string         `json:"fromTemplate"`
	FromImageRegistry map[string]any `json:"fromImageRegistry"`
	StartCmd          string         `json:"startCmd"`
	ReadyCmd          string         `json:"readyCmd"`
	Force             bool           `json:"force"`
	Steps             []struct {
		Type      string   `json:"type"`
		Args      []string `json:"args"`
		Force     bool     `json:"force"`
		FilesHash string   `json:"filesHash"`
	} `json:"steps"`
}

// start answers POST /v2/templates/{templateID}/builds/{buildID}: it
// checks the steps and runs the build in the background.
func (bs *builds) start(w http.ResponseWriter, r *http.Request) {
	if bs.s.cfg.BuildSteps == nil {
		writeError(w, http.StatusNotImplemented, "template builds are not enabled on this server")
		return
	}
	rec := bs.lookup(w, r)
	if rec == nil {
		return
	}
	var body startBody
	if !decodeBody(w, r, &body) {
		return
	}
	df, err := toDockerfile(body, bs.filesDir(rec.team))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	admin := callerKey(r).Admin
	if !admin && df.FromKind == build.FromImage {
		if err := image.CheckClientRef(r.Context(), df.From); err != nil {
			writeError(w, importStatus(err), err.Error())
			return
		}
	}
	started, hashes := time.Now(), fileKeys(rec.team, copyHashes(body))
	if !bs.acquireFiles(hashes) {
		writeError(w, http.StatusBadRequest, "the files of a COPY step were removed meanwhile; upload them again")
		return
	}
	rec.mu.Lock()
	if rec.status != buildWaiting {
		st := rec.status
		rec.mu.Unlock()
		bs.releaseFiles(hashes, time.Time{})
		writeError(w, http.StatusConflict, fmt.Sprintf("build %s was started already (%s)", rec.buildID, st))
		return
	}
	rec.status = buildBuilding
	rec.mu.Unlock()

	log := bs.s.log.With("template_id", rec.templateID, "build_id", rec.buildID)
	opts := build.Options{
		Template: template.Template{
			ID: rec.templateID, Team: rec.team, Name: rec.names[0], CPUCount: rec.cpuCount, MemoryMB: rec.memoryMB,
			StartCmd: body.StartCmd, ReadyCmd: body.ReadyCmd,
		},
		Untrusted: !admin,
		Log:       rec,
		Logger:    log,
	}
	log.Info("template build started", "from", df.From, "steps", len(df.Steps))
	go func() {
		// The client polls for the outcome: its request ending does not
		// end the build (the build's time limit does).
		_, err := bs.s.runBuild(context.WithoutCancel(r.Context()), rec.team, df, opts)
		bs.releaseFiles(hashes, started)
		rec.finish(err)
		if err != nil {
			log.Warn("template build failed", "err", err)
			return
		}
		log.Info("template build finished")
	}()
	w.WriteHeader(http.StatusAccepted)
}

// copyHashes are the uploads body's COPY steps use.
func copyHashes(body startBody) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range body.Steps {
		if strings.EqualFold(s.Type, "COPY") && !seen[s.FilesHash] {
			seen[s.FilesHash] = true
			out = append(out, s.FilesHash)
		}
	}
	return out
}

// runBuild runs a build within the server's bounds: once its team's
// bound (BuildLimiter) lets it, with the node's runtime and templates and
// under BuildLimits, once BuildSlots has room (build.Run waits for that,
// saying so in the build's log).
func (s *Server) runBuild(ctx context.Context, team string, df *build.Dockerfile, opts build.Options) (*build.Result, error) {
	if s.cfg.BuildLimiter != nil {
		release, err := s.cfg.BuildLimiter(ctx, team)
		if err != nil {
			return nil, fmt.Errorf("building template %s: %w", opts.Template.ID, err)
		}
		defer release()
	}
	opts.Steps, opts.Store = s.cfg.BuildSteps, s.cfg.Templates
	opts.Limits, opts.Slots, opts.Keychain = s.cfg.BuildLimits, s.cfg.BuildSlots, s.cfg.RegistryAuth
	return build.Run(ctx, df, opts)
}

// toDockerfile maps E2B's build steps onto the builder's. Steps start as
// E2B's do: as `user` in /home/user; COPY gives files to the current
// user unless it names one. COPY sources come from filesDir.
func toDockerfile(body startBody, filesDir string) (*build.Dockerfile, error) {
	user := "user"
	if body.FromImageRegistry != nil {
		return nil, errors.New("fromImageRegistry (registry credentials) is not supported yet; the server's operator can give it credentials (aenv server --registry-auth)")
	}
	df := &build.Dockerfile{User: "user", Workdir: "/home/user"}
	switch {
	case body.FromImage != "" && body.FromTemplate != "":
		return nil, errors.New("give one of fromImage and fromTemplate, not both")
	case body.FromImage != "":
		df.From, df.FromKind = body.FromImage, build.FromImage
	case body.FromTemplate != "":
		df.From, df.FromKind = body.FromTemplate, build.FromTemplate
	default:
		return nil, errors.New("fromImage or fromTemplate is required")
	}
	for i, s := range body.Steps {
		bad := func(why string) error {
			return fmt.Errorf("step %d (%s): %s", i+1, s.Type, why)
		}
		switch strings.ToUpper(s.Type) {
		case "RUN":
			if len(s.Args) < 1 || len(s.Args) > 2 || s.Args[0] == "" {
				return nil, bad("args are [command] or [command, user]")
			}
			st := build.Step{Kind: build.StepRun, Args: []string{s.Args[0]}, Shell: true}
			if len(s.Args) == 2 {
				st.User = s.Args[1]
			}
			df.Steps = append(df.Steps, st)
		case "ENV":
			if len(s.Args) == 0 || len(s.Args)%2 != 0 {
				return nil, bad("args are name, value pairs")
			}
			df.Steps = append(df.Steps, build.Step{Kind: build.StepEnv, Args: s.Args})
		case "WORKDIR", "USER":
			if len(s.Args) != 1 || s.Args[0] == "" {
				return nil, bad("args are one value")
			}
			if strings.EqualFold(s.Type, "USER") {
				user = s.Args[0]
			}
			df.Steps = append(df.Steps, build.Step{Kind: strings.ToUpper(s.Type), Args: s.Args})
		case "COPY":
			// [src, dest, user, mode], the files uploaded beforehand
			// under filesHash.
			if len(s.Args) < 2 || len(s.Args) > 4 || s.Args[0] == "" || s.Args[1] == "" {
				return nil, bad("args are [src, dest, user, mode]")
			}
			if !filesHash.MatchString(s.FilesHash) {
				return nil, bad("filesHash is missing or invalid")
			}
			dir := filepath.Join(filesDir, s.FilesHash)
			if _, err := os.Stat(filepath.Join(dir, uploadDone)); err != nil {
				return nil, bad("its files were not uploaded (GET /templates/{templateID}/files/{hash} gives the upload URL)")
			}
			st := build.Step{Kind: build.StepCopy, Args: s.Args[:2], Context: filepath.Join(dir, "files"), Chown: user}
			if len(s.Args) > 2 && s.Args[2] != "" {
				st.Chown = s.Args[2]
			}
			if len(s.Args) > 3 {
				st.Chmod = s.Args[3]
			}
			df.Steps = append(df.Steps, st)
		default:
			return nil, bad("unsupported step type")
		}
	}
	return df, nil
}

// statusBody is E2B's TemplateBuildInfo.
type statusBody struct {
	TemplateID string          `json:"templateID"`
	BuildID    string          `json:"buildID"`
	Status     string          `json:"status"`
	Logs       []string        `json:"logs"`
	LogEntries []buildLogEntry `json:"logEntries"`
	Reason     *buildReason    `json:"reason,omitempty"`
}

// status answers GET /templates/{templateID}/builds/{buildID}/status with
// the log entries from logsOffset on (at most limit of them).
func (bs *builds) status(w http.ResponseWriter, r *http.Request) {
	rec := bs.lookup(w, r)
	if rec == nil {
		return
	}
	offset, limit := 0, -1
	q := r.URL.Query()
	for name, dst := range map[string]*int{"logsOffset": &offset, "limit": &limit} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid %s %q", name, v))
				return
			}
			*dst = n
		}
	}
	rec.mu.Lock()
	entries := []buildLogEntry{}
	if i := max(offset-rec.first, 0); i < len(rec.logs) {
		entries = append(entries, rec.logs[i:]...)
	}
	out := statusBody{
		TemplateID: rec.templateID, BuildID: rec.buildID, Status: rec.status,
		Reason: rec.reason,
	}
	rec.mu.Unlock()
	if limit >= 0 && len(entries) > limit {
		entries = entries[:limit]
	}
	out.LogEntries = entries
	out.Logs = make([]string, len(entries))
	for i, e := range entries {
		out.Logs[i] = e.Message
	}
	writeJSON(w, http.StatusOK, out)
}

// filesHash is what a COPY's uploaded files are keyed by (the SDK's
// sha256 of them).
var filesHash = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)

// uploadDone marks an upload directory complete.
const uploadDone = "complete"

// filesDir is where team's uploaded COPY sources are kept, one directory
// per hash. The hash is the client's word, never checked against the
// files: a cache per team means an upload can only ever serve its own
// team's builds.
func (bs *builds) filesDir(team string) string {
	return filepath.Join(bs.filesRoot(), teamTag(team))
}

// files answers the SDK's upload-link request, made before a build with
// COPY steps: whether the files are here already, and where to PUT them.
func (bs *builds) files(w http.ResponseWriter, r *http.Request) {
	if bs.s.cfg.BuildSteps == nil {
		writeError(w, http.StatusNotImplemented, "template builds are not enabled on this server")
		return
	}
	hash := r.PathValue("hash")
	if !filesHash.MatchString(hash) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid files hash %q", hash))
		return
	}
	if !bs.building(w, r) {
		return
	}
	key := fileKey(callerKey(r).Team, hash)
	_, err := os.Stat(filepath.Join(bs.filesRoot(), key, uploadDone))
	if err == nil {
		bs.touchFiles(key)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	writeJSON(w, http.StatusCreated, map[string]any{
		"present": err == nil,
		"url":     fmt.Sprintf("%s://%s/templates/%s/files/%s", scheme, r.Host, url.PathEscape(r.PathValue("templateID")), hash),
		// The SDK sends these with the upload; the caller has the key.
		"headers": map[string]string{"X-API-Key": requestKey(r)},
	})
}

// upload takes a COPY's files as the SDK sends them: a (gzipped) tar of
// them, relative to its context directory. Bodies are bounded by
// MaxUploadBytes.
func (bs *builds) upload(w http.ResponseWriter, r *http.Request) {
	if bs.s.cfg.BuildSteps == nil {
		writeError(w, http.StatusNotImplemented, "template builds are not enabled on this server")
		return
	}
	hash := r.PathValue("hash")
	if !filesHash.MatchString(hash) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid files hash %q", hash))
		return
	}
	if !bs.building(w, r) {
		return
	}
	dir := bs.filesDir(callerKey(r).Team)
	final := filepath.Join(dir, hash)
	if _, err := os.Stat(filepath.Join(final, uploadDone)); err == nil {
		bs.touchFiles(fileKey(callerKey(r).Team, hash))
		w.WriteHeader(http.StatusOK)
		return
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	tmp := filepath.Join(dir, ".upload-"+randomHex(8))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	err := build.UnpackContext(r.Body, filepath.Join(tmp, "files"))
	if err == nil {
		err = os.WriteFile(filepath.Join(tmp, uploadDone), nil, 0o600)
	}
	if err == nil {
		os.RemoveAll(final) // an incomplete earlier upload
		err = os.Rename(tmp, final)
	}
	if err != nil {
		os.RemoveAll(tmp)
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("uploaded files exceed %d bytes (the API's body limit)", tooBig.Limit))
		case errors.Is(err, build.ErrInvalid):
			writeError(w, http.StatusBadRequest, err.Error())
		default:
			writeError(w, http.StatusBadRequest, err.Error())
		}
		return
	}
	w.WriteHeader(http.StatusOK)
}
