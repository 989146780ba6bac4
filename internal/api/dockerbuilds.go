package api

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/aenvhq/aenv/internal/buildjob"
	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/image"
)

// buildTemplate answers POST /templates/builds (an aenv extension): the
// server builds template `name` from a Dockerfile in the uploaded build
// context, streaming the build's output (see imports.go).
//
// Query: name (required), dockerfile (its path in the context; default
// Dockerfile), buildArg=NAME=VALUE (repeatable), cpuCount, memoryMB,
// startCmd, readyCmd, insecure. Body: the build context as a tar
// (gzipped or not).
func (s *Handler) buildTemplate(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Builds == nil {
		writeError(w, http.StatusNotImplemented, "template builds are not enabled on this server")
		return
	}
	p, ok := parseImportParams(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	dockerfile := q.Get("dockerfile")
	if dockerfile == "" {
		dockerfile = "Dockerfile"
	}
	if clean := path.Clean(dockerfile); clean != dockerfile || !filepath.IsLocal(clean) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("dockerfile %q must be a path inside the build context", dockerfile))
		return
	}
	args := map[string]string{}
	for _, a := range q["buildArg"] {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("buildArg %q must be NAME=VALUE", a))
			return
		}
		args[k] = v
	}
	dir, err := s.uploadDir()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	// The context goes when the build ends (Done), or now if it never
	// starts.
	keep := false
	defer func() {
		if !keep {
			os.RemoveAll(dir)
		}
	}()
	ctxDir := filepath.Join(dir, "context")
	if err := buildspec.UnpackContext(r.Body, ctxDir); err != nil {
		writeError(w, importStatus(err), "receiving the build context: "+err.Error())
		return
	}
	f, err := os.Open(filepath.Join(ctxDir, filepath.FromSlash(dockerfile)))
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the build context has no %s", dockerfile))
		return
	}
	df, err := buildspec.Parse(f)
	f.Close()
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// A FROM built from ARGs is checked when the build expands it.
	admin := callerKey(r).Admin
	if !admin && image.IsLocalRef(df.From) {
		writeError(w, http.StatusForbidden, fmt.Sprintf("FROM %s names files on the server's host: that needs an admin key", df.From))
		return
	}

	team := callerKey(r).Team
	rec, err := s.cfg.Builds.Request(r.Context(), buildjob.Record{
		TemplateID: p.tpl.ID, BuildID: randomHex(16), Team: team, Names: []string{p.tpl.Name},
		CPUCount: p.tpl.CPUCount, MemoryMB: p.tpl.MemoryMB,
	})
	if err != nil {
		s.writeBuildError(w, r, err)
		return
	}
	log := s.log.With("template_id", p.tpl.ID, "build_id", rec.BuildID)
	log.Info("template build started", "from", df.From, "steps", len(df.Steps))
	// A client that goes away leaves the build to finish (its outcome
	// stays in its record); its time limit always holds.
	err = s.cfg.Builds.Start(r.Context(), rec.TemplateID, rec.BuildID, buildjob.Spec{
		Dockerfile: df,
		Contexts:   map[string]string{"context": ctxDir},
		Context:    "context",
		BuildArgs:  args,
		Insecure:   p.insecure,
		Untrusted:  !admin,
		StartCmd:   p.tpl.StartCmd, ReadyCmd: p.tpl.ReadyCmd,
		Done: func(*buildjob.Record) { os.RemoveAll(dir) },
	})
	if err != nil {
		s.writeBuildError(w, r, err)
		return
	}
	keep = true
	es := startEvents(w)
	s.followBuild(r.Context(), es, rec.TemplateID, rec.BuildID, 0)
}

// followBuild streams build buildID's log from offset on as events, and
// its outcome last, until it ends or the client goes.
func (s *Handler) followBuild(ctx context.Context, es *eventStream, templateID, buildID string, offset int) {
	end, err := s.cfg.Builds.Follow(ctx, templateID, buildID, offset, func(entries []buildjob.Entry) {
		for _, e := range entries {
			es.send(importEvent{Log: &e.Message})
		}
	})
	switch {
	case err != nil && ctx.Err() != nil:
		return // the client left
	case err != nil:
		es.fail(err)
	case end.Status == buildjob.Ready:
		es.send(importEvent{Done: &importDoneJSON{TemplateID: end.TemplateID, DurationMs: end.Duration().Milliseconds()}})
	default:
		e := &importErrorJSON{Code: http.StatusInternalServerError, Message: end.Reason.Message, ExitCode: end.ExitCode}
		if end.Invalid || (end.Reason.Step != "" && end.Reason.Step != "finalize") {
			e.Code = http.StatusBadRequest // the Dockerfile's own
		}
		es.send(importEvent{Error: e})
	}
}

// buildLogs answers GET /templates/{templateID}/builds/{buildID}/logs
// (an aenv extension of E2B's route): with follow=true, the build's log
// from logsOffset on as it is written, as POST /templates/builds streams
// it, from any server; else the log entries as JSON ({logs}).
func (bs *builds) logs(w http.ResponseWriter, r *http.Request) {
	rec := bs.lookup(w, r)
	if rec == nil {
		return
	}
	q := r.URL.Query()
	offset := 0
	if v := q.Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid logsOffset %q", v))
			return
		}
		offset = n
	}
	if q.Get("follow") == "true" {
		bs.s.followBuild(r.Context(), startEvents(w), rec.TemplateID, rec.BuildID, offset)
		return
	}
	entries, _, err := bs.s.cfg.Builds.Logs(r.Context(), rec.BuildID, offset, -1)
	if err != nil {
		bs.s.writeBuildError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": entries})
}
