package api

import (
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

	"github.com/aenvhq/aenv/internal/buildjob"
	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/image"
	"github.com/aenvhq/aenv/internal/state"
)

// builds runs E2B template builds: a template is requested (POST
// /v3/templates), then its build started with a step list (POST
// /v2/templates/{id}/builds/{buildID}) and polled. The builds are cluster
// records (Config.Builds), run on a node: any server answers their status.
// The uploads of COPY files are this server's: a build started here
// sends them to its node.
type builds struct {
	s  *Handler
	mu sync.Mutex
	// filesInUse counts the running builds that use each upload.
	filesInUse map[string]int
}

func newBuilds(s *Handler) *builds {
	return &builds{s: s, filesInUse: map[string]int{}}
}

// buildReason is E2B's BuildStatusReason.
type buildReason = buildjob.Reason

// buildLogEntry is E2B's BuildLogEntry.
type buildLogEntry = buildjob.Entry

// enabled answers 501 when this server takes no builds.
func (bs *builds) enabled(w http.ResponseWriter) bool {
	if bs.s.cfg.Builds == nil {
		writeError(w, http.StatusNotImplemented, "template builds are not enabled on this server")
		return false
	}
	return true
}

// buildStatus is the HTTP status of a build job's error.
func (s *Handler) writeBuildError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, buildjob.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, buildjob.ErrBusy), errors.Is(err, buildjob.ErrStarted):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, state.ErrUnavailable):
		w.Header().Set("Retry-After", "2")
		writeError(w, http.StatusServiceUnavailable, "the state store is unavailable; try again shortly: "+err.Error())
	default:
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, err.Error())
	}
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
	if !bs.enabled(w) {
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
	rec, err := bs.s.cfg.Builds.Request(r.Context(), buildjob.Record{
		TemplateID: tpl.ID, Team: tpl.Team, BuildID: randomHex(16),
		CPUCount: body.CPUCount, MemoryMB: body.MemoryMB, Names: []string{name},
	})
	if err != nil {
		bs.s.writeBuildError(w, r, err)
		return
	}
	if tags == nil {
		tags = []string{}
	}
	writeJSON(w, http.StatusAccepted, map[string]any{
		"templateID": rec.TemplateID, "buildID": rec.BuildID, "public": false,
		"names": rec.Names, "aliases": rec.Names, "tags": tags,
	})
}

// byID finds the latest build of template id, or of the caller's team's
// template called id (ErrNotFound: neither has one).
func (bs *builds) byID(r *http.Request, id string) (*buildjob.Record, error) {
	rec, err := bs.s.cfg.Builds.Get(r.Context(), id)
	if errors.Is(err, buildjob.ErrNotFound) {
		rec, err = bs.s.cfg.Builds.Get(r.Context(), teamTemplateID(callerKey(r).Team, id))
	}
	if err == nil && !owner(r).Sees(rec.Team) {
		err = buildjob.ErrNotFound
	}
	return rec, err
}

// building checks that the {templateID} a files route names is a build
// the caller's team requested (POST /v3/templates comes first).
func (bs *builds) building(w http.ResponseWriter, r *http.Request) bool {
	id := r.PathValue("templateID")
	_, err := bs.byID(r, id)
	if errors.Is(err, buildjob.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no build of template %s (request one with POST /v3/templates first)", id))
		return false
	}
	if err != nil {
		bs.s.writeBuildError(w, r, err)
		return false
	}
	return true
}

// lookup finds the build a path names.
func (bs *builds) lookup(w http.ResponseWriter, r *http.Request) *buildjob.Record {
	id, buildID := r.PathValue("templateID"), r.PathValue("buildID")
	rec, err := bs.byID(r, id)
	if err == nil && rec.BuildID != buildID {
		err = buildjob.ErrNotFound
	}
	if errors.Is(err, buildjob.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("build %s of template %s not found", buildID, id))
		return nil
	}
	if err != nil {
		bs.s.writeBuildError(w, r, err)
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
	if !bs.enabled(w) {
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
	df, contexts, err := toDockerfile(body, bs.filesDir(rec.Team))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	admin := callerKey(r).Admin
	if !admin && df.FromKind == buildspec.FromImage {
		if err := image.CheckClientRef(r.Context(), df.From); err != nil {
			writeError(w, importStatus(err), err.Error())
			return
		}
	}
	if rec.Status != buildjob.Waiting {
		writeError(w, http.StatusConflict, fmt.Sprintf("build %s was started already (%s)", rec.BuildID, rec.Status))
		return
	}
	started, hashes := time.Now(), fileKeys(rec.Team, copyHashes(body))
	if !bs.acquireFiles(hashes) {
		writeError(w, http.StatusBadRequest, "the files of a COPY step were removed meanwhile; upload them again")
		return
	}
	log := bs.s.log.With("template_id", rec.TemplateID, "build_id", rec.BuildID)
	log.Info("template build started", "from", df.From, "steps", len(df.Steps))
	// The client polls for the outcome: its request ending does not end
	// the build (the build's time limit does, and this server's Close).
	err = bs.s.cfg.Builds.Start(r.Context(), rec.TemplateID, rec.BuildID, buildjob.Spec{
		Dockerfile: df, Contexts: contexts,
		StartCmd: body.StartCmd, ReadyCmd: body.ReadyCmd,
		Untrusted: !admin,
		Done:      func(*buildjob.Record) { bs.releaseFiles(hashes, started) },
	})
	if err != nil {
		bs.releaseFiles(hashes, time.Time{})
		bs.s.writeBuildError(w, r, err)
		return
	}
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

// toDockerfile maps E2B's build steps onto the builder's. Steps start as
// E2B's do: as `user` in /home/user; COPY gives files to the current
// user unless it names one. COPY sources come from filesDir: contexts
// maps the names COPY steps give them to their directories.
func toDockerfile(body startBody, filesDir string) (*buildspec.Dockerfile, map[string]string, error) {
	contexts := map[string]string{}
	df, err := toDockerfileWith(body, filesDir, contexts)
	return df, contexts, err
}

func toDockerfileWith(body startBody, filesDir string, contexts map[string]string) (*buildspec.Dockerfile, error) {
	user := "user"
	if body.FromImageRegistry != nil {
		return nil, errors.New("fromImageRegistry (registry credentials) is not supported yet; the server's operator can give it credentials (aenv server --registry-auth)")
	}
	df := &buildspec.Dockerfile{User: "user", Workdir: "/home/user"}
	switch {
	case body.FromImage != "" && body.FromTemplate != "":
		return nil, errors.New("give one of fromImage and fromTemplate, not both")
	case body.FromImage != "":
		df.From, df.FromKind = body.FromImage, buildspec.FromImage
	case body.FromTemplate != "":
		df.From, df.FromKind = body.FromTemplate, buildspec.FromTemplate
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
			st := buildspec.Step{Kind: buildspec.StepRun, Args: []string{s.Args[0]}, Shell: true}
			if len(s.Args) == 2 {
				st.User = s.Args[1]
			}
			df.Steps = append(df.Steps, st)
		case "ENV":
			if len(s.Args) == 0 || len(s.Args)%2 != 0 {
				return nil, bad("args are name, value pairs")
			}
			df.Steps = append(df.Steps, buildspec.Step{Kind: buildspec.StepEnv, Args: s.Args})
		case "WORKDIR", "USER":
			if len(s.Args) != 1 || s.Args[0] == "" {
				return nil, bad("args are one value")
			}
			if strings.EqualFold(s.Type, "USER") {
				user = s.Args[0]
			}
			df.Steps = append(df.Steps, buildspec.Step{Kind: strings.ToUpper(s.Type), Args: s.Args})
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
			contexts[s.FilesHash] = filepath.Join(dir, "files")
			st := buildspec.Step{Kind: buildspec.StepCopy, Args: s.Args[:2], Context: s.FilesHash, Chown: user}
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
	entries, _, err := bs.s.cfg.Builds.Logs(r.Context(), rec.BuildID, offset, limit)
	if err != nil {
		bs.s.writeBuildError(w, r, err)
		return
	}
	out := statusBody{
		TemplateID: rec.TemplateID, BuildID: rec.BuildID, Status: string(rec.Status),
		Reason: rec.Reason,
	}
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
	if !bs.enabled(w) {
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
	if !bs.enabled(w) {
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
	err := buildspec.UnpackContext(r.Body, filepath.Join(tmp, "files"))
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
		case errors.Is(err, buildspec.ErrInvalid):
			writeError(w, http.StatusBadRequest, err.Error())
		default:
			writeError(w, http.StatusBadRequest, err.Error())
		}
		return
	}
	w.WriteHeader(http.StatusOK)
}
