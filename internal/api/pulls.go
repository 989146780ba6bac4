package api

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/image"
)

// pullProgressJSON is image.Progress on the wire.
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

// pullTemplate answers POST /templates/pulls (an aenv extension): the
// server pulls an OCI image and publishes it as template `name`,
// streaming progress (see imports.go).
//
// Query: name (required), ref for a registry image, or source=oci or
// source=docker-archive with the image in the body (a tar of an OCI
// layout directory, or a `docker save` tarball as it is) and optionally
// ref naming the image in it; cpuCount, memoryMB, startCmd, readyCmd,
// insecure (plain HTTP or unverified TLS to the registry).
func (s *Handler) pullTemplate(w http.ResponseWriter, r *http.Request) {
	if !s.cfg.Pulls {
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
	var dir string
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
		defer os.RemoveAll(dir)
		local := filepath.Join(dir, "image")
		if source == "oci" {
			err = buildspec.UnpackContext(r.Body, local)
		} else {
			err = saveUpload(r, local)
		}
		if err != nil {
			writeError(w, importStatus(err), "receiving the "+source+" image: "+err.Error())
			return
		}
		sel := ""
		if ref != "" {
			sel = ":" + ref
		}
		ref = source + ":" + local + sel
	default:
		writeError(w, http.StatusBadRequest, "source must be oci or docker-archive, not "+source)
		return
	}

	log := s.log.With("template_id", p.tpl.ID)
	log.Info("template pull started", "ref", ref)
	es := startEvents(w)
	select {
	case s.pulls <- struct{}{}:
	default:
		queued := fmt.Sprintf("queued: %d pulls run at once on this server", cap(s.pulls))
		es.send(importEvent{Log: &queued})
		select {
		case s.pulls <- struct{}{}:
		case <-r.Context().Done():
			return // the client left before the pull began
		}
	}
	defer func() { <-s.pulls }()
	res, err := image.Pull(context.WithoutCancel(r.Context()), ref, image.PullOptions{
		Store:    s.cfg.Templates,
		Template: p.tpl,
		Insecure: p.insecure,
		Keychain: s.cfg.RegistryAuth,
		MaxBytes: s.cfg.MaxImageBytes,
		// A pull of the server's own upload reaches no registry.
		PublicOnly: !admin && source == "",
		Progress: func(e image.Progress) {
			es.send(importEvent{Progress: &pullProgressJSON{
				Layer: e.Layer, Layers: e.Layers, Digest: e.Digest,
				Fetched: e.Fetched, Applied: e.Applied, Total: e.Total, Unpacked: e.Unpacked,
				ImageFetched: e.ImageFetched, ImageApplied: e.ImageApplied, ImageTotal: e.ImageTotal,
			}})
		},
		Logger: log,
	})
	if err != nil {
		log.Warn("template pull failed", "err", err)
		es.fail(err)
		return
	}
	log.Info("template pulled", "digest", res.Digest, "layers", res.Layers, "bytes", res.Bytes, "took", res.Duration.Round(time.Millisecond))
	es.send(importEvent{Done: &importDoneJSON{
		TemplateID: res.Template.ID, Digest: res.Digest, Layers: res.Layers, Bytes: res.Bytes,
		DurationMs: res.Duration.Milliseconds(),
	}})
}
