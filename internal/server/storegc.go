package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/cluster"
	"github.com/aenvhq/aenv/internal/store"
	"github.com/aenvhq/aenv/internal/template"
)

// The elected server collects the store's garbage: first the block images
// nothing uses any more (no template's current version, no snapshot, no
// sandbox running on a node), then the chunks no manifest refers to. An
// image is a manifest of its own, so that a replaced or deleted
// template's image stays while anything still runs on it.

// DefaultStoreGCInterval is how often the elected server collects the
// store's garbage unless told otherwise.
const DefaultStoreGCInterval = time.Hour

// imageGrace spares images younger than this: a template's image is
// stored before the description that names it.
const imageGrace = time.Hour

// gcTimeout bounds one collection.
const gcTimeout = 30 * time.Minute

// collectLoop collects the store's garbage every interval while this
// server is the elected one.
func (s *Server) collectLoop(ctx context.Context, remote *store.Repository, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !s.cluster.Leading() {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, gcTimeout)
		if err := collectGarbage(gctx, remote, s.cluster, imageGrace, s.log); err != nil {
			s.log.Warn("collecting the store's garbage", "err", err)
		}
		cancel()
	}
}

// collectGarbage deletes the images of remote nothing uses (older than
// grace), then the chunks nothing refers to.
func collectGarbage(ctx context.Context, remote *store.Repository, c *cluster.Cluster, grace time.Duration, log *slog.Logger) error {
	ms, err := remote.List(ctx)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	present := map[string]bool{}
	var images []*store.Manifest
	for _, m := range ms {
		present[m.ID] = true
		var meta struct {
			BlockImage string `json:"blockImage"`
			RootImage  string `json:"rootImage"`
		}
		json.Unmarshal(m.Meta, &meta)
		switch {
		case strings.HasSuffix(m.ID, blockimage.TraceSuffix):
		case strings.HasPrefix(m.ID, template.ImagePrefix):
			images = append(images, m)
		default: // a template's description or a snapshot
			live[meta.BlockImage] = true
			live[meta.RootImage] = true
		}
	}
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		for _, img := range n.Images {
			live[img] = true
		}
	}
	deleted := 0
	for _, m := range images {
		if live[m.ID] || time.Since(m.Created) < grace {
			continue
		}
		if err := remote.Delete(ctx, m.ID); err != nil {
			return err
		}
		delete(present, m.ID)
		deleted++
		log.Info("block image deleted: no template, snapshot or sandbox uses it", "image", m.ID, "bytes", m.Size)
	}
	// Prefetch lists follow their images.
	for _, m := range ms {
		if img, ok := strings.CutSuffix(m.ID, blockimage.TraceSuffix); ok && !present[img] {
			remote.Delete(ctx, m.ID)
		}
	}
	st, err := remote.GC(ctx)
	if err != nil {
		return err
	}
	log.Info("store garbage collected", "images_deleted", deleted, "chunks_deleted", st.ChunksDeleted,
		"bytes_deleted", st.BytesDeleted, "chunks_kept", st.ChunksKept, "deferred_for_saves", st.Deferred)
	return nil
}
