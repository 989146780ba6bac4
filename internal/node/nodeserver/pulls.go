package nodeserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/image"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/template"
)

// DefaultMaxPulls is how many pulls a node runs at once unless
// PullConfig.MaxPulls says otherwise.
const DefaultMaxPulls = 2

// PullConfig is what the node pulls templates with: its template catalog
// and its bounds. A node without one refuses pulls (unimplemented). The
// images clients upload arrive as build contexts (PutBuildContext), so
// that a node pulls uploads only when it runs builds too.
type PullConfig struct {
	// Templates receives the templates pulled (and publishes them to the
	// store the nodes share, when it has one).
	Templates *template.Catalog
	// MaxImageBytes bounds each image (image.PullOptions.MaxBytes); 0:
	// no bound.
	MaxImageBytes int64
	// MaxPulls bounds the pulls that run at once (the others wait, and
	// say so); 0 means DefaultMaxPulls.
	MaxPulls int
	// Keychain holds the registry credentials; nil: anonymous.
	Keychain authn.Keychain
	Logger   *slog.Logger
}

// puller runs a node's pulls within its bounds.
type puller struct {
	cfg PullConfig
	// slots holds a token per pull running.
	slots chan struct{}
}

func newPuller(cfg *PullConfig) *puller {
	if cfg == nil {
		return nil
	}
	n := cfg.MaxPulls
	if n <= 0 {
		n = DefaultMaxPulls
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &puller{cfg: *cfg, slots: make(chan struct{}, n)}
}

// Pull implements nodeapi.Node.
func (l *Local) Pull(ctx context.Context, req *nodev1.PullRequest, fn func(*nodev1.PullEvent)) error {
	p := l.pulls
	if p == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this node runs no template pulls"))
	}
	if !buildName.MatchString(req.PullId) || req.Template == nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid pull id %q or no template", req.PullId))
	}
	ref, err := l.pullRef(req)
	if err != nil {
		return err
	}
	if req.Source != nodev1.PullRequest_SOURCE_REGISTRY {
		defer os.RemoveAll(filepath.Join(l.opts.Builds.ContextDir, req.PullId))
	}
	t := req.Template
	log := p.cfg.Logger.With("template_id", t.Id, "pull_id", req.PullId)
	select {
	case p.slots <- struct{}{}:
	default:
		fn(&nodev1.PullEvent{Lines: []string{fmt.Sprintf("queued: %d pulls run at once on this node", cap(p.slots))}})
		select {
		case p.slots <- struct{}{}:
		case <-ctx.Done():
			return connect.NewError(connect.CodeCanceled, context.Cause(ctx))
		}
	}
	defer func() { <-p.slots }()
	log.Info("template pull started", "ref", ref)
	res, err := image.Pull(ctx, ref, image.PullOptions{
		Store: p.cfg.Templates,
		Template: template.Template{
			ID: t.Id, Team: t.Team, Name: t.Name, CPUCount: int(t.CpuCount), MemoryMB: int(t.MemoryMb),
			StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd,
		},
		Insecure:   req.Insecure,
		Keychain:   p.cfg.Keychain,
		MaxBytes:   p.cfg.MaxImageBytes,
		PublicOnly: req.PublicOnly,
		Progress: func(e image.Progress) {
			fn(&nodev1.PullEvent{Progress: &nodev1.PullProgress{
				Layer: int32(e.Layer), Layers: int32(e.Layers), Digest: e.Digest,
				Fetched: e.Fetched, Applied: e.Applied, Total: e.Total, Unpacked: e.Unpacked,
				ImageFetched: e.ImageFetched, ImageApplied: e.ImageApplied, ImageTotal: e.ImageTotal,
			}})
		},
		Logger: log,
	})
	if ctx.Err() != nil {
		return connect.NewError(connect.CodeCanceled, context.Cause(ctx))
	}
	out := &nodev1.PullResult{}
	if err != nil {
		log.Warn("template pull failed", "err", err)
		out.Error, out.ErrorClass = err.Error(), pullClass(err)
	} else {
		log.Info("template pulled", "digest", res.Digest, "layers", res.Layers, "bytes", res.Bytes, "took", res.Duration.Round(time.Millisecond))
		out.TemplateId, out.Digest, out.Layers, out.Bytes = res.Template.ID, res.Digest, int32(res.Layers), res.Bytes
		out.DurationMs = res.Duration.Milliseconds()
	}
	fn(&nodev1.PullEvent{Result: out})
	return nil
}

// pullRef is the reference image.Pull reads req's image by: the
// registry's, or the upload's place on this node.
func (l *Local) pullRef(req *nodev1.PullRequest) (string, error) {
	if req.Source == nodev1.PullRequest_SOURCE_REGISTRY {
		// A client's pull names no file of this host (the control plane
		// checked it too).
		if req.PublicOnly && image.IsLocalRef(req.Ref) {
			return "", connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s names files on the node's host: %w", req.Ref, image.ErrForbidden))
		}
		return req.Ref, nil
	}
	if l.opts.Builds == nil {
		return "", connect.NewError(connect.CodeFailedPrecondition, errors.New("this node takes no uploads (it runs no builds)"))
	}
	if !buildName.MatchString(req.Context) {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid context name %q", req.Context))
	}
	dir := filepath.Join(l.opts.Builds.ContextDir, req.PullId, req.Context)
	if _, err := os.Stat(dir); err != nil {
		return "", connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the image of pull %s was not received (PutBuildContext comes first)", req.PullId))
	}
	ref := "oci:" + dir
	if req.Source == nodev1.PullRequest_SOURCE_DOCKER_ARCHIVE {
		ref = "docker-archive:" + filepath.Join(dir, "image.tar")
	}
	if req.Ref != "" {
		ref += ":" + req.Ref
	}
	return ref, nil
}

// pullClass classifies a pull's error for the control plane, which
// answers its client with the status it stands for.
func pullClass(err error) nodev1.PullResult_ErrorClass {
	switch {
	case errors.Is(err, image.ErrForbidden):
		return nodev1.PullResult_ERROR_CLASS_FORBIDDEN
	case errors.Is(err, image.ErrTooLarge):
		return nodev1.PullResult_ERROR_CLASS_TOO_LARGE
	case errors.Is(err, image.ErrBadReference):
		return nodev1.PullResult_ERROR_CLASS_BAD_REFERENCE
	case errors.Is(err, buildspec.ErrInvalid):
		return nodev1.PullResult_ERROR_CLASS_INVALID
	case errors.Is(err, image.ErrNotFound), errors.Is(err, template.ErrNotFound):
		return nodev1.PullResult_ERROR_CLASS_NOT_FOUND
	case errors.Is(err, image.ErrUnauthorized):
		return nodev1.PullResult_ERROR_CLASS_UNAUTHORIZED
	case errors.Is(err, image.ErrUnreachable):
		return nodev1.PullResult_ERROR_CLASS_UNREACHABLE
	}
	return nodev1.PullResult_ERROR_CLASS_UNSPECIFIED
}
