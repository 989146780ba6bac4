package template

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/store"
)

// Templates are published to the store the nodes share, beside the
// snapshots, so that a node that lacks one fetches it when a sandbox needs
// it and every server lists it. A template is kept there as its block
// image (chunked, compressed and deduplicated by the store), which nodes
// serve on demand (package blockimage, node-side) rather than copy, and its
// description as the metadata of a manifest of its own; a template
// without an image travels as one tar of its tree. `base` is not
// published, as every node has its own.

// remotePrefix tells templates from snapshots (whose ids are random) in
// the store.
const remotePrefix = "template-"

func remoteID(id string) string { return remotePrefix + id }

// rootfsTar is the name of the root filesystem's tar in a published
// template.
const rootfsTar = "rootfs.tar"

// publishTimeout bounds uploading one template.
const publishTimeout = 30 * time.Minute

// tarFlags keep what a root filesystem needs: numeric owners, modes,
// extended attributes (file capabilities), hard links, devices, holes.
// GNU tar does all of it; it is on every host aenv runs on.
var tarFlags = []string{"--numeric-owner", "--xattrs", "--xattrs-include=*", "--sparse"}

// publish puts t, files and description, into the remote store: its
// block image as a manifest of its own, named by its content (so that a
// replaced template's old image stays for the sandboxes and snapshots
// still using it), and the description as the template's manifest. A
// template without a block image is published as one tar of its tree.
func (s *Catalog) publish(t *Template) error {
	if s.remote == nil || t.ID == BaseID {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	start := time.Now()
	files := map[string]string{}
	if t.BlockImage != "" {
		img := map[string]string{ImageManifestFile: filepath.Join(s.dir, t.ID, imageFile)}
		if _, st, err := s.images.Save(ctx, t.BlockImage, "", img, nil); err == nil {
			s.log.Info("template block image published", "template_id", t.ID, "image", t.BlockImage,
				"chunks", st.ChunksTotal, "chunks_uploaded", st.ChunksUploaded, "bytes_uploaded", st.BytesUploaded)
		} else if !errors.Is(err, store.ErrExists) {
			return fmt.Errorf("publishing template %s: %w", t.ID, err)
		}
	} else {
		tmp := filepath.Join(s.dir, ".publish-"+t.ID+".tar")
		defer os.Remove(tmp)
		args := append([]string{"--create", "--file", tmp, "--directory", filepath.Join(s.dir, t.ID, "rootfs")}, tarFlags...)
		if out, err := exec.CommandContext(ctx, "tar", append(args, ".")...).CombinedOutput(); err != nil {
			return fmt.Errorf("publishing template %s: archiving its root filesystem: %w: %s", t.ID, err, strings.TrimSpace(string(out)))
		}
		files[rootfsTar] = tmp
	}
	meta, err := json.Marshal(t)
	if err != nil {
		return err
	}
	// A new version replaces the description (its image is new).
	if err := s.remote.Delete(ctx, remoteID(t.ID)); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("publishing template %s: replacing the previous version: %w", t.ID, err)
	}
	if _, _, err := s.remote.Save(ctx, remoteID(t.ID), "", files, meta); err != nil {
		return fmt.Errorf("publishing template %s: %w", t.ID, err)
	}
	s.log.Info("template published to the store", "template_id", t.ID, "image", t.BlockImage, "took_ms", time.Since(start).Milliseconds())
	return nil
}

// remoteTemplates lists the templates in the remote store.
func (s *Catalog) remoteTemplates(ctx context.Context) ([]*Template, error) {
	ms, err := s.remote.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing templates in the store: %w", err)
	}
	var out []*Template
	for _, m := range ms {
		id, ok := strings.CutPrefix(m.ID, remotePrefix)
		if !ok {
			continue
		}
		var t Template
		if json.Unmarshal(m.Meta, &t) != nil || t.ID != id {
			continue
		}
		t.Remote = true
		out = append(out, &t)
	}
	return out, nil
}

// remoteGet describes template idOrAlias from the remote store.
func (s *Catalog) remoteGet(ctx context.Context, idOrAlias string) (*Template, error) {
	if m, err := s.remote.Get(ctx, remoteID(idOrAlias)); err == nil {
		var t Template
		if err := json.Unmarshal(m.Meta, &t); err != nil {
			return nil, fmt.Errorf("reading template %s from the store: %w", idOrAlias, err)
		}
		t.Remote = true
		return &t, nil
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("looking up template %q in the store: %w", idOrAlias, err)
	}
	all, err := s.remoteTemplates(ctx)
	if err != nil {
		return nil, err
	}
	for _, t := range all {
		for _, a := range t.Aliases {
			if a == idOrAlias {
				return t, nil
			}
		}
	}
	return nil, fmt.Errorf("looking up template %q: %w", idOrAlias, ErrNotFound)
}

// Fetch is Get for a node that will run the template: one this host
// lacks is brought from the remote store (once, however many ask at the
// same time) and kept.
func (s *Catalog) Fetch(ctx context.Context, idOrAlias string) (*Template, error) {
	t, err := s.Get(idOrAlias)
	if err != nil || !t.Remote {
		return t, err
	}
	v, err, _ := s.fetching.Do(t.ID, func() (any, error) {
		if local, err := s.read(t.ID); err == nil {
			return local, nil // fetched meanwhile
		}
		return s.fetch(ctx, t)
	})
	if err != nil {
		return nil, err
	}
	return v.(*Template), nil
}

// fetch downloads template t into the store's directory.
func (s *Catalog) fetch(ctx context.Context, t *Template) (*Template, error) {
	start := time.Now()
	staging := filepath.Join(s.dir, ".fetch-"+t.ID)
	os.RemoveAll(staging)
	defer os.RemoveAll(staging)
	root := filepath.Join(staging, "tree", "rootfs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("fetching template %s: %w", t.ID, err)
	}
	if t.BlockImage != "" {
		if err := s.fetchImage(ctx, t, root, filepath.Join(staging, "tree", imageFile)); err != nil {
			return nil, fmt.Errorf("fetching template %s: %w", t.ID, err)
		}
	} else {
		if err := s.remote.Restore(ctx, remoteID(t.ID), staging); err != nil {
			return nil, fmt.Errorf("fetching template %s: %w", t.ID, err)
		}
		args := append([]string{"--extract", "--preserve-permissions", "--file", filepath.Join(staging, rootfsTar), "--directory", root}, tarFlags...)
		if out, err := exec.CommandContext(ctx, "tar", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("fetching template %s: unpacking it: %w: %s", t.ID, err, strings.TrimSpace(string(out)))
		}
	}
	local := *t
	local.Remote = false
	b, err := json.MarshalIndent(&local, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(staging, "tree", "template.json"), b, 0o644); err != nil {
		return nil, fmt.Errorf("fetching template %s: %w", t.ID, err)
	}
	s.mu.Lock()
	err = os.Rename(filepath.Join(staging, "tree"), filepath.Join(s.dir, t.ID))
	s.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("fetching template %s: %w", t.ID, err)
	}
	s.log.Info("template fetched from the store", "template_id", t.ID, "took_ms", time.Since(start).Milliseconds())
	return s.read(t.ID)
}
