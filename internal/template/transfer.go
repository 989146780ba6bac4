package template

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// Without a store the nodes share, a template goes with the snapshot
// that runs on it from node to node (package transfer): Export gives the
// files that carry it, Adopt makes the template of them on the other
// node.

// Files that carry a template between nodes.
const (
	// DescriptionFile is the template's description.
	DescriptionFile = "template.json"
	// ImageFileName is its block image, when it has one here.
	ImageFileName = imageFile
	// TreeFile is a tar of its tree, for a template without one.
	TreeFile = rootfsTar
)

// Export returns the files that carry template idOrAlias, which this host
// holds, to a node that cannot fetch it from a store: its description
// and its block image, or a tar of its tree when it has none here. What
// Export made for it (the description, the tar) is removed by done. base
// and the builtins are every host's own: they are not exported.
func (s *Catalog) Export(ctx context.Context, idOrAlias string) (files map[string]string, done func(), err error) {
	t, err := s.GetLocal(idOrAlias)
	if err != nil {
		return nil, nil, fmt.Errorf("exporting template %s: %w", idOrAlias, err)
	}
	if t.ID == BaseID || s.builtin(t.ID) != nil {
		return nil, nil, fmt.Errorf("exporting template %s: every node has its own", t.ID)
	}
	var suffix [6]byte
	rand.Read(suffix[:])
	tmp := filepath.Join(s.dir, ".export-"+t.ID+"-"+hex.EncodeToString(suffix[:]))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, nil, fmt.Errorf("exporting template %s: %w", t.ID, err)
	}
	done = func() { os.RemoveAll(tmp) }
	defer func() {
		if err != nil {
			done()
		}
	}()
	desc := *t
	files = map[string]string{DescriptionFile: filepath.Join(tmp, DescriptionFile)}
	if t.ImageFile != "" {
		files[ImageFileName] = t.ImageFile
	} else {
		// Without its image here it travels as a tree, and is one there.
		desc.BlockImage, desc.ImageBytes = "", 0
		files[TreeFile] = filepath.Join(tmp, TreeFile)
		args := append([]string{"--create", "--file", files[TreeFile], "--directory", t.RootFS}, tarFlags...)
		if out, err := exec.CommandContext(ctx, "tar", append(args, ".")...).CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("exporting template %s: archiving its root filesystem: %w: %s", t.ID, err, strings.TrimSpace(string(out)))
		}
	}
	desc.Remote = false
	b, err := json.MarshalIndent(&desc, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("exporting template %s: %w", t.ID, err)
	}
	if err := os.WriteFile(files[DescriptionFile], b, 0o600); err != nil {
		return nil, nil, fmt.Errorf("exporting template %s: %w", t.ID, err)
	}
	return files, done, nil
}

// Adopt makes a template of the files Export gave, received into dir:
// its tree is unpacked (from its block image or its tar) out of sight
// and put in place in one rename. A template of that id this host has
// meanwhile is kept. dir is left as it was.
func (s *Catalog) Adopt(ctx context.Context, dir string) (*Template, error) {
	b, err := os.ReadFile(filepath.Join(dir, DescriptionFile))
	if err != nil {
		return nil, fmt.Errorf("adopting a template: %w", err)
	}
	var t Template
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("adopting a template: its description: %w", err)
	}
	if !ValidID(t.ID) || t.ID == BaseID {
		return nil, fmt.Errorf("adopting template %q: invalid id", t.ID)
	}
	if local, err := s.read(t.ID); err == nil {
		return local, nil
	}
	var suffix [6]byte
	rand.Read(suffix[:])
	staging := filepath.Join(s.dir, ".adopt-"+t.ID+"-"+hex.EncodeToString(suffix[:]))
	defer os.RemoveAll(staging)
	root := filepath.Join(staging, "tree", "rootfs")
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("adopting template %s: %w", t.ID, err)
	}
	if t.BlockImage != "" {
		if s.blocks == nil {
			return nil, fmt.Errorf("adopting template %s: it is a block image, which this catalog cannot read", t.ID)
		}
		file := filepath.Join(staging, "tree", imageFile)
		if err := moveFile(filepath.Join(dir, ImageFileName), file); err != nil {
			return nil, fmt.Errorf("adopting template %s: its block image: %w", t.ID, err)
		}
		if err := s.blocks.Extract(ctx, file, root); err != nil {
			return nil, fmt.Errorf("adopting template %s: %w", t.ID, err)
		}
	} else {
		args := append([]string{"--extract", "--preserve-permissions", "--file", filepath.Join(dir, TreeFile), "--directory", root}, tarFlags...)
		if out, err := exec.CommandContext(ctx, "tar", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("adopting template %s: unpacking it: %w: %s", t.ID, err, strings.TrimSpace(string(out)))
		}
	}
	t.Remote = false
	out, err := json.MarshalIndent(&t, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(staging, "tree", DescriptionFile), out, 0o644); err != nil {
		return nil, fmt.Errorf("adopting template %s: %w", t.ID, err)
	}
	s.mu.Lock()
	err = os.Rename(filepath.Join(staging, "tree"), filepath.Join(s.dir, t.ID))
	s.mu.Unlock()
	if err != nil {
		if local, rerr := s.read(t.ID); rerr == nil {
			return local, nil // adopted meanwhile (another transfer)
		}
		return nil, fmt.Errorf("adopting template %s: %w", t.ID, err)
	}
	s.log.Info("template adopted from another node", "template_id", t.ID, "image", t.BlockImage)
	return s.read(t.ID)
}

// moveFile renames src to dst, or copies it where they are on two
// filesystems.
func moveFile(src, dst string) error {
	if err := os.Rename(src, dst); !errors.Is(err, syscall.EXDEV) {
		return err
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
