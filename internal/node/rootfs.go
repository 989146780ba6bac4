package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/aenvhq/aenv/internal/blockimage"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/template"
)

// RootFSProvider prepares a template's root filesystem for a sandbox:
// what the runtime mounts as its read-only lower layer. Two exist: the
// template's directory (DirRootFS: builds, tests, templates without a
// block image) and its block image served by the node's image server
// (ImageRootFS, the default).
type RootFSProvider interface {
	// Prepare returns tpl's root filesystem for sandbox id, held until
	// Release(id), with a mount point for each of binds. Preparing again
	// for the same id is a no-op.
	Prepare(ctx context.Context, tpl *template.Template, id string, binds []runtime.Bind) (runtime.RootFS, error)
	// Release lets go of what Prepare held for sandbox id (nothing held:
	// a no-op).
	Release(ctx context.Context, id string) error
	// Serves reports whether the provider runs tpl without its tree on
	// this host: else the node fetches the tree first.
	Serves(tpl *template.Template) bool
	// Sync releases what is held for sandboxes not in live (a restarted
	// node's survivors).
	Sync(ctx context.Context, live []string) error
}

// DirRootFS serves templates from their directories.
type DirRootFS struct{}

// Prepare implements RootFSProvider.
// The runtime creates missing mount points in the tree itself.
func (DirRootFS) Prepare(_ context.Context, tpl *template.Template, _ string, _ []runtime.Bind) (runtime.RootFS, error) {
	if tpl.RootFS == "" {
		return runtime.RootFS{}, fmt.Errorf("template %s: its files are not on this node", tpl.ID)
	}
	return runtime.RootFS{Dir: tpl.RootFS, Image: tpl.ImageFile}, nil
}

// Release implements RootFSProvider.
func (DirRootFS) Release(context.Context, string) error { return nil }

// Serves implements RootFSProvider.
func (DirRootFS) Serves(*template.Template) bool { return false }

// Sync implements RootFSProvider.
func (DirRootFS) Sync(context.Context, []string) error { return nil }

// ImageRootFS serves templates that have a block image from it, mounted by
// the node's image server (once per node, whatever the number of
// sandboxes), read on demand from the store unless this host has the
// image whole; the others from their directories.
type ImageRootFS struct {
	Client *blockimage.Client
	// Eager fetches a remote image whole before mounting it.
	Eager bool
	// WorkDir holds, for a sandbox whose binds land where the image has
	// nothing (a volume at a new path), the host overlay that adds their
	// mount points.
	WorkDir string
}

// Prepare implements RootFSProvider.
func (p *ImageRootFS) Prepare(ctx context.Context, tpl *template.Template, id string, binds []runtime.Bind) (_ runtime.RootFS, err error) {
	if tpl.BlockImage == "" {
		return DirRootFS{}.Prepare(ctx, tpl, id, binds)
	}
	src := blockimage.Source{Image: tpl.BlockImage, Template: tpl.ID, File: tpl.ImageFile, Eager: p.Eager}
	dir, file, err := p.Client.Acquire(ctx, src, id)
	if err != nil {
		return runtime.RootFS{}, fmt.Errorf("preparing the root filesystem of template %s: %w", tpl.ID, err)
	}
	var missing []runtime.Bind
	for _, b := range binds {
		if _, err := os.Lstat(filepath.Join(dir, b.Destination)); err != nil {
			missing = append(missing, b)
		}
	}
	if len(missing) == 0 {
		return runtime.RootFS{Dir: dir, Image: file}, nil
	}
	defer func() {
		if err != nil {
			p.Release(context.WithoutCancel(ctx), id)
		}
	}()
	merged, err := p.overlay(dir, id, missing)
	if err != nil {
		return runtime.RootFS{}, fmt.Errorf("preparing the root filesystem of template %s: %w", tpl.ID, err)
	}
	return runtime.RootFS{Dir: merged, Image: file}, nil
}

// overlay mounts a host overlay of the read-only image at lower with the
// mount points of binds added: the runtime binds them over the root's own
// files, which it cannot create in an image. The sandbox's writes go to
// its own layer all the same (the runtime's).
func (p *ImageRootFS) overlay(lower, id string, binds []runtime.Bind) (string, error) {
	base := filepath.Join(p.WorkDir, id)
	upper, work, merged := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("adding mount points: %w", err)
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", merged, "overlay", unix.MS_NODEV|unix.MS_NOSUID, opts); err != nil {
		return "", fmt.Errorf("adding mount points: mounting an overlay: %w", err)
	}
	for _, b := range binds {
		target := filepath.Join(merged, b.Destination)
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return "", fmt.Errorf("adding mount point %s: %w", b.Destination, err)
		}
		var err error
		if fi, serr := os.Stat(b.Source); serr == nil && !fi.IsDir() {
			err = os.WriteFile(target, nil, 0o644)
		} else {
			err = os.Mkdir(target, 0o755)
		}
		if err != nil && !os.IsExist(err) {
			return "", fmt.Errorf("adding mount point %s: %w", b.Destination, err)
		}
	}
	return merged, nil
}

// Release implements RootFSProvider.
func (p *ImageRootFS) Release(ctx context.Context, id string) error {
	var errs []error
	if p.WorkDir != "" {
		errs = append(errs, ReleaseOverlay(p.WorkDir, id))
	}
	errs = append(errs, p.Client.Release(ctx, id))
	return errors.Join(errs...)
}

// Serves implements RootFSProvider.
func (p *ImageRootFS) Serves(tpl *template.Template) bool { return tpl.BlockImage != "" }

// Sync implements RootFSProvider: the overlays and images of sandboxes
// not in live are released.
func (p *ImageRootFS) Sync(ctx context.Context, live []string) error {
	if p.WorkDir != "" {
		entries, _ := os.ReadDir(p.WorkDir)
		for _, e := range entries {
			if !slices.Contains(live, e.Name()) {
				ReleaseOverlay(p.WorkDir, e.Name())
			}
		}
	}
	_, err := p.Client.Sync(ctx, live)
	return err
}

// ReleaseOverlay unmounts and removes the overlay ImageRootFS made for
// sandbox id under workDir, if any.
func ReleaseOverlay(workDir, id string) error {
	base := filepath.Join(workDir, id)
	if err := unix.Unmount(filepath.Join(base, "merged"), unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("releasing the root filesystem of %s: %w", id, err)
	}
	return os.RemoveAll(base)
}
