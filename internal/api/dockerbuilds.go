package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/build"
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
func (s *Server) buildTemplate(w http.ResponseWriter, r *http.Request) {
	if s.cfg.BuildSteps == nil {
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
	defer os.RemoveAll(dir)
	ctxDir := filepath.Join(dir, "context")
	if err := build.UnpackContext(r.Body, ctxDir); err != nil {
		writeError(w, importStatus(err), "receiving the build context: "+err.Error())
		return
	}
	f, err := os.Open(filepath.Join(ctxDir, filepath.FromSlash(dockerfile)))
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("the build context has no %s", dockerfile))
		return
	}
	df, err := build.Parse(f)
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

	log := s.log.With("template_id", p.tpl.ID)
	log.Info("template build started", "from", df.From, "steps", len(df.Steps))
	es := startEvents(w)
	// A client that goes away leaves the build to finish (its outcome
	// stays); its time limit always holds.
	res, err := s.runBuild(context.WithoutCancel(r.Context()), callerKey(r).Team, df, build.Options{
		Template:   p.tpl,
		ContextDir: ctxDir,
		BuildArgs:  args,
		Insecure:   p.insecure,
		Untrusted:  !admin,
		Log:        es,
		Logger:     log,
	})
	if err != nil {
		var se *build.StepError
		if !errors.As(err, &se) {
			log.Warn("template build failed", "err", err)
		}
		es.fail(err)
		return
	}
	log.Info("template built", "took", res.Duration.Round(time.Millisecond))
	es.send(importEvent{Done: &importDoneJSON{TemplateID: res.Template.ID, DurationMs: res.Duration.Milliseconds()}})
}
