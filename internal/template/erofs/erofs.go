// Package erofs makes and reads templates' block images for a node's
// template catalog (template.BlockImages), with package blockimage: the
// node side's half of package template, kept apart so that the control
// plane, which lists templates, links no block-device code. The node's
// wiring (agent) and tests import it.
package erofs

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/template"
)

// Images makes erofs block images with mkfs.erofs and reads them by
// mounting them. Its zero value is ready; it holds no state.
type Images struct{}

var _ template.BlockImages = Images{}

// Build implements template.BlockImages.
func (Images) Build(ctx context.Context, root, out string) error {
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return fmt.Errorf("%w: mkfs.erofs not installed (apt-get install erofs-utils)", template.ErrNoBlockImages)
	}
	return blockimage.Build(ctx, root, out)
}

// Extract implements template.BlockImages.
func (Images) Extract(ctx context.Context, file, root string) error {
	mnt := filepath.Join(filepath.Dir(file), ".mnt")
	defer os.RemoveAll(mnt)
	m, err := blockimage.MountFile(mnt, file)
	if err != nil {
		return fmt.Errorf("extracting block image %s: %w", file, err)
	}
	defer m.Close()
	// cp -a keeps owners, modes, links, devices, times and xattrs.
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--", m.Dir+"/.", root+"/").CombinedOutput(); err != nil {
		return fmt.Errorf("copying the files of block image %s: %w: %s", file, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// EnsureBaseImage makes the EROFS image of the base template's tree at
// root (template.BaseImageFile) unless a fresh one is there, and says
// whether it made one. Servers sharing a tree may race to make it: each
// writes a file of its own and renames it into place.
func EnsureBaseImage(ctx context.Context, root string) (bool, error) {
	if template.FreshBaseImage(root) != "" {
		return false, nil
	}
	if _, err := exec.LookPath("mkfs.erofs"); err != nil {
		return false, fmt.Errorf("%w: mkfs.erofs not installed (apt-get install erofs-utils)", template.ErrNoBlockImages)
	}
	out := template.BaseImageFile(root)
	f, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".*")
	if err != nil {
		return false, fmt.Errorf("making the base template's image: %w", err)
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp)
	if err := blockimage.Build(ctx, root, tmp); err != nil {
		return false, err
	}
	if err := os.Rename(tmp, out); err != nil {
		return false, fmt.Errorf("making the base template's image: %w", err)
	}
	return true, nil
}
