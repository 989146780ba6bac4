// Package image turns OCI images into templates: it pulls an image from a
// registry, an OCI layout directory or a `docker save` archive, unpacks its
// layers into a root filesystem (whiteouts applied, nothing written outside
// the root), makes it usable by aenv (a shell, the `user` account) and
// publishes it atomically as a template. The API's pulls, template builds
// (package build) and the server wiring import it.
package image

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/aenvhq/aenv/internal/template"
)

// Errors that classify why a pull failed; the returned errors wrap them and
// say more.
var (
	// ErrBadReference is an image reference that cannot be parsed, or
	// names a transport aenv does not read.
	ErrBadReference = errors.New("invalid image reference")
	// ErrNotFound is an image, tag or blob the source does not have.
	ErrNotFound = errors.New("image not found")
	// ErrUnauthorized is a registry refusing our credentials (or their
	// absence).
	ErrUnauthorized = errors.New("not authorized")
	// ErrUnreachable is a registry that could not be talked to.
	ErrUnreachable = errors.New("registry unreachable")
	// ErrPlatform is an image with nothing for linux/amd64.
	ErrPlatform = errors.New("no linux/amd64 image")
	// ErrUnsafeLayer is a layer with entries that would land outside the
	// root filesystem.
	ErrUnsafeLayer = errors.New("layer writes outside the root filesystem")
	// ErrNoShell is an image without /bin/sh or /bin/bash; every command
	// aenv runs in a sandbox goes through a shell.
	ErrNoShell = errors.New("image has no shell (/bin/sh): aenv runs commands with a shell; use an image that has one")
	// ErrTooLarge is an image over PullOptions.MaxBytes.
	ErrTooLarge = errors.New("image too large")
	// ErrForbidden is a source the caller may not pull from: a file on
	// the server's host, or a registry at a private address (see
	// CheckClientRef and PullOptions.PublicOnly).
	ErrForbidden = errors.New("image source not allowed")
)

// Default resources of a pulled template, the same as the base template's.
const (
	DefaultCPUCount = 2
	DefaultMemoryMB = 512
)

// PullOptions configures Pull.
type PullOptions struct {
	// Store receives the template.
	Store *template.Catalog
	// Template is what to publish: its ID names the template (replacing
	// one of that name once the new one is complete); resources and
	// start/ready commands are recorded as given (zero resources get the
	// defaults). Pull fills in Image and CreatedAt.
	Template template.Template
	// Insecure allows plain HTTP and unverified TLS to the registry.
	// Registries on localhost and loopback addresses get HTTP without it.
	Insecure bool
	// Keychain supplies registry credentials (LoadRegistryAuth reads the
	// operator's); nil pulls anonymously. The docker config of the
	// server's user is never read on its own.
	Keychain authn.Keychain
	// MaxBytes, when positive, bounds the image: its layers as stored
	// (usually compressed, as downloaded) and, apart, what they unpack
	// to (the tar streams' bytes), each at most MaxBytes. Past either the
	// pull fails with ErrTooLarge, having written no more than that.
	MaxBytes int64
	// PublicOnly refuses to connect to registries, and to the hosts they
	// redirect to, at private, loopback, link-local or other non-public
	// addresses, checked at each connection (so a name that resolves
	// differently later is caught too): a pull a client asked for must
	// not reach the server's own networks.
	PublicOnly bool
	// Jobs is how many layers are downloaded at once; 0 means 3.
	Jobs int
	// Progress, if set, is told how the pull advances. Calls never overlap.
	Progress func(Progress)
	// Logger receives debug detail; nil discards it.
	Logger *slog.Logger
}

// Progress is one step of a pull. Before any byte is fetched, Pull reports
// every layer once with nothing done.
type Progress struct {
	// Layer is the index of the layer this is about, of Layers.
	Layer, Layers int
	// Digest is the layer's digest ("" when the source does not say).
	Digest string
	// Fetched and Applied count the layer's bytes (as stored, usually
	// compressed) downloaded and unpacked so far, of Total (-1 when
	// unknown). Layers download ahead of unpacking, so Applied trails.
	Fetched, Applied, Total int64
	// Unpacked says the layer has been applied to the root filesystem.
	Unpacked bool
	// ImageFetched, ImageApplied and ImageTotal are the same over all
	// layers.
	ImageFetched, ImageApplied, ImageTotal int64
}

// Result describes a finished pull.
type Result struct {
	// Template is the published template.
	Template *template.Template
	// Digest identifies the image unpacked: its manifest digest, or for a
	// docker archive its config digest (docker's image id).
	Digest string
	// Layers is the number of layers applied.
	Layers int
	// Bytes is how many bytes of layers were read.
	Bytes int64
	// Duration is how long the pull took.
	Duration time.Duration
}

// Pull fetches the image ref and publishes it as template
// opts.Template.ID. ref names its transport the way skopeo does:
// `docker://REF` or a bare REF (`ubuntu:22.04` is Docker Hub's
// library/ubuntu:22.04), `oci:PATH[:TAG]` for an OCI layout directory, and
// `docker-archive:PATH[:REF]` for a `docker save` tarball. An index
// resolves to its linux/amd64 image.
//
// A pull that fails or is cancelled leaves no template and no partial
// files, and leaves an existing template of the same name untouched.
func Pull(ctx context.Context, ref string, opts PullOptions) (*Result, error) {
	start := time.Now()
	tpl := opts.Template
	if opts.Store == nil {
		return nil, errors.New("pulling image: no template store")
	}
	if !template.ValidID(tpl.ID) {
		return nil, fmt.Errorf("pulling %s: template name %q is invalid (lower-case letters, digits, '.', '_' and '-', at most 63, starting with a letter or digit)", ref, tpl.ID)
	}
	if tpl.ID == template.BaseID {
		return nil, fmt.Errorf("pulling %s: template name %q is reserved for the built-in base template", ref, tpl.ID)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	opts.Logger = opts.Logger.With("template_id", tpl.ID)
	stage, err := opts.Store.NewStage(tpl.ID)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	defer stage.Abort()
	img, err := UnpackTo(ctx, ref, stage.RootFS(), stage.ScratchDir(), opts)
	if err != nil {
		return nil, err
	}
	if tpl.CPUCount <= 0 {
		tpl.CPUCount = DefaultCPUCount
	}
	if tpl.MemoryMB <= 0 {
		tpl.MemoryMB = DefaultMemoryMB
	}
	tpl.CreatedAt = time.Now().UTC()
	tpl.RootFS = ""
	tpl.Image = &img.Config
	if err := stage.Commit(&tpl); err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	published, err := opts.Store.Get(tpl.ID)
	if err != nil {
		return nil, fmt.Errorf("pulling %s: reading back template %s: %w", ref, tpl.ID, err)
	}
	res := &Result{
		Template: published,
		Digest:   img.Config.Digest,
		Layers:   img.Layers,
		Bytes:    img.Bytes,
		Duration: time.Since(start),
	}
	opts.Logger.Debug("image pulled", "ref", ref, "digest", res.Digest, "bytes", res.Bytes, "took", res.Duration)
	return res, nil
}

// Unpacked describes an image UnpackTo unpacked.
type Unpacked struct {
	// Config is the image's configuration, as a template records it.
	Config template.ImageConfig
	// Layers is the number of layers applied.
	Layers int
	// Bytes is how many bytes of layers were read.
	Bytes int64
}

// UnpackTo fetches the image ref (named as for Pull) and unpacks it into
// root, an empty directory of the caller's, made usable as Pull's trees
// are; downloads are spooled in scratch. It publishes nothing (opts.Store
// and opts.Template are not used): a template build unpacks its FROM
// image onto its own bounded disk this way.
func UnpackTo(ctx context.Context, ref, root, scratch string, opts PullOptions) (*Unpacked, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Jobs <= 0 {
		opts.Jobs = 3
	}
	log := opts.Logger.With("ref", ref)
	// Whatever ends the pull (a bad layer too) ends its requests.
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// fail wraps err, or says the pull was interrupted (and why) when it
	// was: cancellation surfaces as many different errors.
	fail := func(err error) error {
		if parent.Err() != nil {
			return fmt.Errorf("pulling %s: %w", ref, cancelled(parent))
		}
		return fmt.Errorf("pulling %s: %w", ref, err)
	}
	src, err := openSource(ctx, ref, opts)
	if err != nil {
		return nil, fail(err)
	}
	defer src.close()
	log.Debug("image resolved", "digest", src.digest, "layers", len(src.layers))
	if err := checkSize(src, opts.MaxBytes); err != nil {
		return nil, fail(err)
	}
	rep := newReporter(src.layers, opts.Progress)
	rep.start()
	if err := unpackAll(ctx, cancel, src, root, scratch, rep, opts, log); err != nil {
		return nil, fail(err)
	}
	if ctx.Err() != nil {
		return nil, fail(ctx.Err())
	}
	cfg := src.config.Config
	return &Unpacked{
		Config: template.ImageConfig{
			Ref: ref, Digest: src.digest, Env: cfg.Env, WorkingDir: cfg.WorkingDir,
			User: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd,
		},
		Layers: len(src.layers),
		Bytes:  rep.imageFetched(),
	}, nil
}

// cancelled is why ctx ended, keeping the context error matchable:
// "interrupt signal received (context canceled)".
func cancelled(ctx context.Context) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, ctx.Err()) {
		return cause
	}
	return fmt.Errorf("%w (%w)", cause, ctx.Err())
}

// reporter turns byte counts from several goroutines into Progress calls
// that never overlap.
type reporter struct {
	fn     func(Progress)
	mu     sync.Mutex
	layers []Progress
	image  Progress
}

func newReporter(layers []*layerSource, fn func(Progress)) *reporter {
	r := &reporter{fn: fn, layers: make([]Progress, len(layers))}
	for i, l := range layers {
		r.layers[i] = Progress{Layer: i, Layers: len(layers), Digest: l.digest, Total: l.size}
		if l.size > 0 {
			r.image.ImageTotal += l.size
		}
	}
	return r
}

func (r *reporter) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.layers {
		r.emit(i)
	}
}

// fetched counts n more bytes of layer i downloaded.
func (r *reporter) fetched(i int, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.layers[i].Fetched += n
	r.image.ImageFetched += n
	r.emit(i)
}

// applied counts n more bytes of layer i unpacked.
func (r *reporter) applied(i int, n int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.layers[i].Applied += n
	r.image.ImageApplied += n
	r.emit(i)
}

// unpacked marks layer i applied.
func (r *reporter) unpacked(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.layers[i].Unpacked = true
	r.emit(i)
}

func (r *reporter) imageFetched() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.image.ImageFetched
}

// emit reports layer i; r.mu is held.
func (r *reporter) emit(i int) {
	if r.fn == nil {
		return
	}
	p := r.layers[i]
	p.ImageFetched, p.ImageApplied, p.ImageTotal = r.image.ImageFetched, r.image.ImageApplied, r.image.ImageTotal
	r.fn(p)
}

// isRoot reports whether this process can keep file owners and make
// device nodes.
func isRoot() bool { return os.Geteuid() == 0 }
