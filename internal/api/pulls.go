package api

import (
	"net/http"
	"os"
	"path/filepath"

	"github.com/aenvhq/aenv/internal/buildjob"
	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/image"
)

// pullProgressJSON is a pull's progress (image.Progress) on the wire.
type pullProgressJSON struct {
	Layer        int    `json:"layer"`
	Layers       int    `json:"layers"`
	Digest       string `json:"digest,omitempty"`
	Fetched      int64  `json:"fetched"`
	Applied      int64  `json:"applied"`
	Total        int64  `json:"total"`
	Unpacked     bool   `json:"unpacked,omitempty"`
	ImageFetched int64  `json:"imageFetched"`
	ImageApplied int64  `json:"imageApplied"`
	ImageTotal   int64  `json:"imageTotal"`
}

// pullEventBuffer is how many of a pull's events wait for a slow client;
// past it progress (and log lines, which the job's log keeps) are
// dropped rather than hold the node's stream up.
const pullEventBuffer = 256

// pullTemplate answers POST /templates/pulls (an aenv extension): a node
// pulls an OCI image and publishes it as template `name`, and this
// server streams the pull's progress (see imports.go). The pull is a
// build job (buildjob, KindPull): it runs on a node the cluster picks,
// under that node's bounds (image size, pulls at once, registry
// credentials), and outlives a client that leaves.
//
// Query: name (required), ref for a registry image, or source=oci or
// source=docker-archive with the image in the body (a tar of an OCI
// layout directory, or a `docker save` tarball as it is) and optionally
// ref naming the image in it; cpuCount, memoryMB, startCmd, readyCmd,
// insecure (plain HTTP or unverified TLS to the registry).
func (s *Handler) pullTemplate(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.Pulls || s.cfg.Builds == nil {
		writeError(w, http.StatusNotImplemented, "this server has neither a local node nor a store its nodes share (--store), so a template pulled here would reach no node")
		return
	}
	p, ok := parseImportParams(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	ref, source := q.Get("ref"), q.Get("source")
	admin := callerKey(r).Admin
	pull := &buildjob.PullSpec{
		Ref: ref, Insecure: p.insecure,
		// A pull of the client's own upload reaches no registry.
		PublicOnly: !admin && source == "",
	}
	var contexts map[string]string
	dir := ""
	// The upload goes when the pull ends (Done), or now if it never
	// starts.
	keep := false
	defer func() {
		if !keep && dir != "" {
			os.RemoveAll(dir)
		}
	}()
	switch source {
	case "":
		if ref == "" {
			writeError(w, http.StatusBadRequest, "give ref (a registry image), or source=oci or source=docker-archive with the image in the body")
			return
		}
		if !admin {
			if err := image.CheckClientRef(r.Context(), ref); err != nil {
				writeError(w, importStatus(err), err.Error())
				return
			}
		}
	case "oci", "docker-archive":
		var err error
		if dir, err = s.uploadDir(); err != nil {
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		upload := filepath.Join(dir, "image")
		if source == "oci" {
			pull.Source = buildjob.FromOCILayout
			err = buildspec.UnpackContext(r.Body, upload)
		} else {
			// The tarball travels to the node inside a context.
			pull.Source = buildjob.FromDockerArchive
			if err = os.Mkdir(upload, 0o700); err == nil {
				err = saveUpload(r, filepath.Join(upload, "image.tar"))
			}
		}
		if err != nil {
			writeError(w, importStatus(err), "receiving the "+source+" image: "+err.Error())
			return
		}
		pull.Context, contexts = "image", map[string]string{"image": upload}
	default:
		writeError(w, http.StatusBadRequest, "source must be oci or docker-archive, not "+source)
		return
	}

	rec, err := s.cfg.Builds.Request(r.Context(), buildjob.Record{
		TemplateID: p.tpl.ID, BuildID: randomHex(16), Kind: buildjob.KindPull, Team: p.tpl.Team,
		Names: []string{p.tpl.Name}, CPUCount: p.tpl.CPUCount, MemoryMB: p.tpl.MemoryMB,
	})
	if err != nil {
		s.writeBuildError(w, r, err)
		return
	}
	log := s.log.With("template_id", p.tpl.ID, "build_id", rec.BuildID)
	log.Info("template pull started", "ref", ref, "source", source)

	// The job's callbacks run on its goroutine, which must not wait for
	// this client: events queue here, and Done comes after all of them.
	events := make(chan importEvent, pullEventBuffer)
	ended := make(chan *buildjob.Record, 1)
	offer := func(ev importEvent) {
		select {
		case events <- ev:
		default:
		}
	}
	pull.Progress = func(e buildjob.Progress) {
		offer(importEvent{Progress: &pullProgressJSON{
			Layer: e.Layer, Layers: e.Layers, Digest: e.Digest,
			Fetched: e.Fetched, Applied: e.Applied, Total: e.Total, Unpacked: e.Unpacked,
			ImageFetched: e.ImageFetched, ImageApplied: e.ImageApplied, ImageTotal: e.ImageTotal,
		}})
	}
	err = s.cfg.Builds.Start(r.Context(), rec.TemplateID, rec.BuildID, buildjob.Spec{
		Pull:     pull,
		Contexts: contexts,
		StartCmd: p.tpl.StartCmd, ReadyCmd: p.tpl.ReadyCmd,
		Lines: func(lines []string) {
			for _, l := range lines {
				offer(importEvent{Log: &l})
			}
		},
		Done: func(end *buildjob.Record) {
			if dir != "" {
				os.RemoveAll(dir)
			}
			ended <- end
		},
	})
	if err != nil {
		s.writeBuildError(w, r, err)
		return
	}
	keep = true
	es := startEvents(w)
	for {
		select {
		case ev := <-events:
			es.send(ev)
		case end := <-ended:
			for drained := false; !drained; {
				select {
				case ev := <-events:
					es.send(ev)
				default:
					drained = true
				}
			}
			es.send(pullEnd(end))
			return
		case <-r.Context().Done():
			return // the client left; the pull goes on and its outcome stays
		}
	}
}

// pullEnd is the last event of pull end.
func pullEnd(end *buildjob.Record) importEvent {
	if end.Status == buildjob.Ready {
		done := &importDoneJSON{TemplateID: end.TemplateID, DurationMs: end.Duration().Milliseconds()}
		if p := end.Pulled; p != nil {
			done.Digest, done.Layers, done.Bytes = p.Digest, p.Layers, p.Bytes
		}
		return importEvent{Done: done}
	}
	msg := "the pull failed"
	if end.Reason != nil {
		msg = end.Reason.Message
	}
	return importEvent{Error: &importErrorJSON{Code: pullStatus(end), Message: msg}}
}

// pullStatus is the HTTP status a failed pull's error stands for, as
// importStatus is for the errors found here.
func pullStatus(end *buildjob.Record) int {
	switch {
	case end.Invalid:
		return http.StatusBadRequest
	case end.Class == buildjob.ClassForbidden, end.Class == buildjob.ClassUnauthorized:
		return http.StatusForbidden
	case end.Class == buildjob.ClassTooLarge:
		return http.StatusRequestEntityTooLarge
	case end.Class == buildjob.ClassBadReference:
		return http.StatusBadRequest
	case end.Class == buildjob.ClassNotFound:
		return http.StatusNotFound
	case end.Class == buildjob.ClassUnreachable:
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}
