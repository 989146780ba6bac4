package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aenvhq/aenv/internal/blockimage"
)

// imageFile is where a template's block image is kept beside its tree.
const imageFile = "image.erofs"

// imageTimeout bounds building one template's block image.
const imageTimeout = 30 * time.Minute

// buildImage converts the stage's tree into its block image, named by
// its content, and records it in t. The tree stays: builds start from it,
// and this host runs the template from it. Without mkfs.erofs the
// template is kept as a tree only, and said so.
func (st *Stage) buildImage(t *Template) error {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		st.store.log.Warn("template kept as a tree only: other nodes copy it whole (install erofs-utils for block images)", "template_id", t.ID)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), imageTimeout)
	defer cancel()
	start := time.Now()
	if err := addMountPoints(st.RootFS(), t.Tools); err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	out := filepath.Join(st.dir, imageFile)
	if err := blockimage.Build(ctx, st.RootFS(), out); err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	name, size, err := imageName(out)
	if err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	t.BlockImage, t.ImageBytes = name, size
	st.store.log.Info("template block image built", "template_id", t.ID, "image", name, "bytes", size, "took_ms", time.Since(start).Milliseconds())
	return nil
}

// mountPoints are the files every sandbox gets bound over its root
// filesystem (the runtime's: resolv.conf, hosts, envd).
var mountPoints = []string{"etc/resolv.conf", "etc/hosts", ".aenv/envd"}

// addMountPoints makes sure the files sandboxes get bound over the tree
// exist in it as plain files: the runtime cannot create them in a
// read-only image (a tree got them written into it at the first start).
// A symlink there (resolv.conf often is one) becomes an empty file: what
// it pointed to is hidden by the bind anyway.
func addMountPoints(root string, tools []string) error {
	points := slices.Clone(mountPoints)
	for _, t := range tools {
		points = append(points, ".aenv/"+t)
	}
	for _, p := range points {
		full := filepath.Join(root, p)
		fi, err := os.Lstat(full)
		if err == nil && fi.Mode().IsRegular() {
			continue
		}
		if err == nil && fi.Mode()&os.ModeSymlink != 0 {
			if err := os.Remove(full); err != nil {
				return fmt.Errorf("adding mount point /%s: %w", p, err)
			}
		} else if err == nil {
			continue // a directory or a device: leave it to the runtime
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			return fmt.Errorf("adding mount point /%s: %w", p, err)
		}
		if err := os.WriteFile(full, nil, 0o644); err != nil {
			return fmt.Errorf("adding mount point /%s: %w", p, err)
		}
	}
	return nil
}

// imageName names an image by its content, so that the same tree
// published twice is one image and a changed one is a new image.
func imageName(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("hashing block image: %w", err)
	}
	return "image-" + hex.EncodeToString(h.Sum(nil))[:32], n, nil
}

// fetchImage fills root with the tree of t's block image, fetched whole
// from the store (a build starting from the template needs its files),
// and keeps the image as file.
func (s *Store) fetchImage(ctx context.Context, t *Template, root, file string) error {
	dl := filepath.Join(filepath.Dir(file), ".image")
	defer os.RemoveAll(dl)
	if err := s.images.Restore(ctx, t.BlockImage, dl); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dl, blockimage.ImageName), file); err != nil {
		return err
	}
	mnt := filepath.Join(filepath.Dir(file), ".mnt")
	defer os.RemoveAll(mnt)
	m, err := blockimage.MountFile(mnt, file)
	if err != nil {
		return err
	}
	defer m.Close()
	// cp -a keeps owners, modes, links, devices, times and xattrs.
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--", m.Dir+"/.", root+"/").CombinedOutput(); err != nil {
		return fmt.Errorf("copying the image's files: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
