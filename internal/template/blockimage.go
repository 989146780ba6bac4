package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// BlockImages makes templates' block images and reads them back. The
// node side gives one (package template/erofs, over internal/blockimage),
// so that this package, which the control plane uses to list, look up
// and delete templates, links no block-device code. A Catalog without
// one keeps the templates it commits as trees only and cannot fetch a
// template published as a block image.
type BlockImages interface {
	// Build writes the block image of the tree at root as file out,
	// or returns an error wrapping ErrNoBlockImages when this host
	// cannot make one.
	Build(ctx context.Context, root, out string) error
	// Extract copies the files of block image file into root, with
	// their owners, modes, links, devices, times and xattrs.
	Extract(ctx context.Context, file, root string) error
}

// ErrNoBlockImages says this host cannot make block images (a missing
// tool): its templates travel as trees.
var ErrNoBlockImages = errors.New("block images cannot be made on this host")

// ImageManifestFile is the file a template's block image is kept as in
// its manifest in the store; it is the name block images are served
// under (blockimage.ImageName), which package template/erofs checks.
const ImageManifestFile = "image"

// imageFile is where a template's block image is kept beside its tree.
const imageFile = "image.erofs"

// imageTimeout bounds building one template's block image.
const imageTimeout = 30 * time.Minute

// buildImage converts the stage's tree into its block image, named by
// its content, and records it in t. The tree stays: builds start from it,
// and this host runs the template from it. Without a way to make block
// images the template is kept as a tree only, and said so.
func (st *Stage) buildImage(t *Template) error {
	if st.store.blocks == nil {
		st.store.log.Warn("template kept as a tree only: this catalog makes no block images", "template_id", t.ID)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), imageTimeout)
	defer cancel()
	start := time.Now()
	src, done, err := withMountPoints(st.RootFS(), filepath.Join(st.dir, "image-src"), t.Tools)
	if err != nil {
		return fmt.Errorf("committing template %s: %w", st.id, err)
	}
	out := filepath.Join(st.dir, imageFile)
	err = st.store.blocks.Build(ctx, src, out)
	done()
	if errors.Is(err, ErrNoBlockImages) {
		st.store.log.Warn("template kept as a tree only: other nodes copy it whole", "template_id", t.ID, "err", err)
		return nil
	}
	if err != nil {
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

// withMountPoints returns the tree at root as the image is built from:
// with the files sandboxes get bound over it present as plain files,
// since the runtime cannot create them in a read-only image. When the
// tree lacks some, it is a host overlay (in work) adding them, so that the
// template's own tree stays as it was pulled or built; done removes it.
// A symlink there (resolv.conf often is one) becomes an empty file: what
// it pointed to is hidden by the bind anyway.
func withMountPoints(root, work string, tools []string) (dir string, done func(), err error) {
	points := slices.Clone(mountPoints)
	for _, t := range tools {
		points = append(points, ".aenv/"+t)
	}
	var missing []string
	for _, p := range points {
		fi, err := os.Lstat(filepath.Join(root, p))
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			missing = append(missing, p)
		}
	}
	if len(missing) == 0 {
		return root, func() {}, nil
	}
	upper, wk, merged := filepath.Join(work, "upper"), filepath.Join(work, "work"), filepath.Join(work, "merged")
	done = func() {
		unix.Unmount(merged, unix.MNT_DETACH)
		os.RemoveAll(work)
	}
	for _, d := range []string{upper, wk, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			done()
			return "", nil, fmt.Errorf("adding mount points: %w", err)
		}
	}
	if err := unix.Mount("overlay", merged, "overlay", 0, "lowerdir="+root+",upperdir="+upper+",workdir="+wk); err != nil {
		done()
		return "", nil, fmt.Errorf("adding mount points: mounting an overlay of the tree: %w", err)
	}
	for _, p := range missing {
		full := filepath.Join(merged, p)
		os.Remove(full) // a symlink
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err == nil {
			err = os.WriteFile(full, nil, 0o644)
		}
		if err != nil {
			done()
			return "", nil, fmt.Errorf("adding mount point /%s: %w", p, err)
		}
	}
	return merged, done, nil
}

// ImagePrefix begins every block image's id in the store.
const ImagePrefix = "image-"

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
	return ImagePrefix + hex.EncodeToString(h.Sum(nil))[:32], n, nil
}

// fetchImage fills root with the tree of t's block image, fetched whole
// from the store (a build starting from the template needs its files),
// and keeps the image as file.
func (s *Catalog) fetchImage(ctx context.Context, t *Template, root, file string) error {
	if s.blocks == nil {
		return fmt.Errorf("template %s is a block image, which this catalog cannot read", t.ID)
	}
	dl := filepath.Join(filepath.Dir(file), ".image")
	defer os.RemoveAll(dl)
	if err := s.images.Restore(ctx, t.BlockImage, dl); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dl, ImageManifestFile), file); err != nil {
		return err
	}
	return s.blocks.Extract(ctx, file, root)
}
