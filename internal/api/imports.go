package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/image"
	"github.com/aenvhq/aenv/internal/template"
)

// The aenv routes that make templates (POST /templates/pulls and POST
// /templates/builds) answer with a stream of newline-delimited JSON
// events, so that a client shows progress and logs while the server works
// and learns the outcome at the end:
//
//	{"progress": {...}}    a pull's layer progress (pulls)
//	{"log": "line"}        a build's output (builds)
//	{"done": {...}}        the template was published; last event
//	{"error": {...}}       it was not, and nothing was left behind; last
//
// Errors found before any work starts (bad parameters, an unknown FROM)
// are plain {code, message} answers with their status instead.

// importEvent is one event of the stream.
type importEvent struct {
	Progress *pullProgressJSON `json:"progress,omitempty"`
	Log      *string           `json:"log,omitempty"`
	Done     *importDoneJSON   `json:"done,omitempty"`
	Error    *importErrorJSON  `json:"error,omitempty"`
}

// importDoneJSON describes the published template.
type importDoneJSON struct {
	TemplateID string `json:"templateID"`
	Digest     string `json:"digest,omitempty"`
	Layers     int    `json:"layers,omitempty"`
	Bytes      int64  `json:"bytes,omitempty"`
	DurationMs int64  `json:"durationMs"`
}

// importErrorJSON says why a template was not made. Code is the HTTP
// status the error would have had; ExitCode a failed RUN step's.
type importErrorJSON struct {
	Code     int    `json:"code"`
	Message  string `json:"message"`
	ExitCode int    `json:"exitCode,omitempty"`
}

// eventStream writes importEvents, flushing each so that the client sees
// it at once. It is safe for concurrent use (a build's log and its
// progress arrive from other goroutines).
type eventStream struct {
	mu  sync.Mutex
	rc  *http.ResponseController
	enc *json.Encoder
	err error
}

// startEvents answers 200 with an NDJSON body; events follow.
func startEvents(w http.ResponseWriter) *eventStream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	es := &eventStream{rc: http.NewResponseController(w), enc: json.NewEncoder(w)}
	es.rc.Flush()
	return es
}

func (es *eventStream) send(ev importEvent) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.err != nil {
		return // the client left; the work goes on and its outcome stays
	}
	if es.err = es.enc.Encode(ev); es.err == nil {
		es.err = es.rc.Flush()
	}
}

// Write sends a build's output, a log event per line.
func (es *eventStream) Write(p []byte) (int, error) {
	for _, line := range splitLines(p) {
		es.send(importEvent{Log: &line})
	}
	return len(p), nil
}

func splitLines(p []byte) []string {
	var out []string
	start := 0
	for i, c := range p {
		if c == '\n' {
			out = append(out, string(p[start:i]))
			start = i + 1
		}
	}
	if start < len(p) {
		out = append(out, string(p[start:]))
	}
	return out
}

// fail sends the last event of an import that did not work.
func (es *eventStream) fail(err error) {
	es.send(importEvent{Error: &importErrorJSON{Code: importStatus(err), Message: err.Error()}})
}

// importStatus classifies an import's error as the HTTP status it stands
// for.
func importStatus(err error) int {
	var tooBig *http.MaxBytesError
	switch {
	case errors.Is(err, image.ErrForbidden):
		return http.StatusForbidden
	case errors.As(err, &tooBig), errors.Is(err, image.ErrTooLarge):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, buildspec.ErrInvalid), errors.Is(err, image.ErrBadReference):
		return http.StatusBadRequest
	case errors.Is(err, template.ErrNotFound), errors.Is(err, image.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, image.ErrUnauthorized):
		return http.StatusForbidden
	case errors.Is(err, image.ErrUnreachable):
		return http.StatusBadGateway
	default:
		return http.StatusInternalServerError
	}
}

// importParams are the query parameters both routes take.
type importParams struct {
	tpl      template.Template
	insecure bool
}

// parseImportParams reads name, cpuCount, memoryMB, startCmd, readyCmd
// and insecure; on error it has answered 400.
func parseImportParams(w http.ResponseWriter, r *http.Request) (importParams, bool) {
	q := r.URL.Query()
	if err := validTemplateName(q.Get("name")); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return importParams{}, false
	}
	// The template is the caller's team's, under the name it gave.
	p := importParams{tpl: newTemplate(r, q.Get("name"))}
	p.tpl.StartCmd, p.tpl.ReadyCmd = q.Get("startCmd"), q.Get("readyCmd")
	for _, f := range []struct {
		name string
		dst  *int
		max  int
	}{{"cpuCount", &p.tpl.CPUCount, 64}, {"memoryMB", &p.tpl.MemoryMB, 1 << 20}} {
		v := q.Get(f.name)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > f.max {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("%s must be a whole number from 1 to %d, not %q", f.name, f.max, v))
			return p, false
		}
		*f.dst = n
	}
	p.insecure = q.Get("insecure") == "true" || q.Get("insecure") == "1"
	if p.insecure && !callerKey(r).Admin {
		writeError(w, http.StatusForbidden, "insecure (plain HTTP or unverified TLS to a registry) needs an admin key")
		return p, false
	}
	return p, true
}

// uploadDir makes a private scratch directory for an import's upload;
// the caller removes it.
func (s *Handler) uploadDir() (string, error) {
	dir := filepath.Join(s.cfg.Templates.Dir(), ".imports")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("making upload directory: %w", err)
	}
	return os.MkdirTemp(dir, "import-")
}

// saveUpload writes the request body to file, bounded by MaxUploadBytes.
func saveUpload(r *http.Request, file string) error {
	f, err := os.OpenFile(file, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("receiving the upload: %w", err)
	}
	return nil
}
