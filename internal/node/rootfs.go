package node

import (
	"context"
	"fmt"

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
	// Release(id). Preparing again for the same id is a no-op.
	Prepare(ctx context.Context, tpl *template.Template, id string) (runtime.RootFS, error)
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
func (DirRootFS) Prepare(_ context.Context, tpl *template.Template, _ string) (runtime.RootFS, error) {
	if tpl.RootFS == "" {
		return runtime.RootFS{}, fmt.Errorf("template %s: its files are not on this node", tpl.ID)
	}
	return runtime.RootFS{Dir: tpl.RootFS}, nil
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
}

// Prepare implements RootFSProvider.
func (p *ImageRootFS) Prepare(ctx context.Context, tpl *template.Template, id string) (runtime.RootFS, error) {
	if tpl.BlockImage == "" {
		return DirRootFS{}.Prepare(ctx, tpl, id)
	}
	src := blockimage.Source{Image: tpl.BlockImage, Template: tpl.ID, File: tpl.ImageFile, Eager: p.Eager}
	dir, err := p.Client.Acquire(ctx, src, id)
	if err != nil {
		return runtime.RootFS{}, fmt.Errorf("preparing the root filesystem of template %s: %w", tpl.ID, err)
	}
	return runtime.RootFS{Dir: dir, Image: tpl.ImageFile}, nil
}

// Release implements RootFSProvider.
func (p *ImageRootFS) Release(ctx context.Context, id string) error {
	return p.Client.Release(ctx, id)
}

// Serves implements RootFSProvider.
func (p *ImageRootFS) Serves(tpl *template.Template) bool { return tpl.BlockImage != "" }

// Sync implements RootFSProvider.
func (p *ImageRootFS) Sync(ctx context.Context, live []string) error {
	_, err := p.Client.Sync(ctx, live)
	return err
}
