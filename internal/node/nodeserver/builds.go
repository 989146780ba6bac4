package nodeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/aenvhq/aenv/internal/build"
	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
	"github.com/aenvhq/aenv/internal/template"
)

// BuildConfig is what the node runs template builds with: its own
// stepper, template store and bounds. A node without one refuses builds
// (unimplemented).
type BuildConfig struct {
	// Steps runs the builds' RUN and COPY steps (the node's runtime).
	Steps build.Stepper
	// Templates receives the templates built (and publishes them to the
	// store the nodes share, when it has one).
	Templates *template.Catalog
	// Limits bound each build; Slots how many run at once.
	Limits build.Limits
	Slots  *build.Slots
	// Keychain holds the registry credentials of FROM images; nil:
	// anonymous.
	Keychain authn.Keychain
	// ContextDir keeps the build contexts PutBuildContext receives.
	ContextDir string
	Logger     *slog.Logger
}

// contextMaxAge is how long a build context no Build took is kept.
const contextMaxAge = time.Hour

// buildName is what build ids and context names look like.
var buildName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)

// maxLineBytes cuts longer log lines into several.
const maxLineBytes = 16 << 10

// PutBuildContext implements nodeapi.Node.
func (l *Local) PutBuildContext(ctx context.Context, req *nodev1.PutBuildContextRequest) (*nodev1.PutBuildContextResponse, error) {
	bc := l.opts.Builds
	if bc == nil {
		return nil, connect.NewError(connect.CodeUnimplemented, errors.New("this node runs no template builds"))
	}
	if !buildName.MatchString(req.BuildId) || !buildName.MatchString(req.Name) {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid build id %q or context name %q", req.BuildId, req.Name))
	}
	if req.Offset == 0 {
		sweepContexts(bc, time.Now())
	}
	dir := filepath.Join(bc.ContextDir, req.BuildId)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("receiving context %s of build %s: %w", req.Name, req.BuildId, err))
	}
	tarPath := filepath.Join(dir, req.Name+".tar")
	flags := os.O_WRONLY | os.O_APPEND
	if req.Offset == 0 {
		flags |= os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(tarPath, flags, 0o600)
	if err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("receiving context %s of build %s: %w", req.Name, req.BuildId, err))
	}
	fi, err := f.Stat()
	if err == nil && fi.Size() != req.Offset {
		err = connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("chunk at %d, but %d bytes were received", req.Offset, fi.Size()))
	}
	if err == nil {
		_, err = f.Write(req.Data)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && req.Last {
		err = unpackTar(tarPath, filepath.Join(dir, req.Name))
	}
	if err != nil {
		if errors.Is(err, buildspec.ErrInvalid) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("receiving context %s of build %s: %w", req.Name, req.BuildId, err))
		}
		var ce *connect.Error
		if errors.As(err, &ce) {
			return nil, ce
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("receiving context %s of build %s: %w", req.Name, req.BuildId, err))
	}
	return &nodev1.PutBuildContextResponse{}, nil
}

func unpackTar(tarPath, dest string) error {
	f, err := os.Open(tarPath)
	if err != nil {
		return err
	}
	defer f.Close()
	os.RemoveAll(dest) // an earlier attempt's
	if err := buildspec.UnpackContext(f, dest); err != nil {
		return err
	}
	return os.Remove(tarPath)
}

// sweepContexts removes the contexts of builds that never came.
func sweepContexts(bc *BuildConfig, now time.Time) {
	entries, err := os.ReadDir(bc.ContextDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > contextMaxAge {
			os.RemoveAll(filepath.Join(bc.ContextDir, e.Name()))
		}
	}
}

// Build implements nodeapi.Node.
func (l *Local) Build(ctx context.Context, req *nodev1.BuildRequest, fn func(*nodev1.BuildEvent)) error {
	bc := l.opts.Builds
	if bc == nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("this node runs no template builds"))
	}
	if !buildName.MatchString(req.BuildId) || req.Template == nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("invalid build id %q or no template", req.BuildId))
	}
	dir := filepath.Join(bc.ContextDir, req.BuildId)
	defer os.RemoveAll(dir)
	contextOf := func(name string) (string, error) {
		if !buildName.MatchString(name) {
			return "", fmt.Errorf("invalid context name %q", name)
		}
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("context %s of build %s was not received (PutBuildContext comes first)", name, req.BuildId)
		}
		return p, nil
	}
	df := &buildspec.Dockerfile{
		From: req.From, FromKind: buildspec.FromKind(req.FromKind), FromLine: int(req.FromLine),
		User: req.User, Workdir: req.Workdir,
		PreArgs: stepsFromWire(req.PreArgs),
		Steps:   stepsFromWire(req.Steps),
	}
	for i := range df.Steps {
		if c := df.Steps[i].Context; c != "" {
			p, err := contextOf(c)
			if err != nil {
				return connect.NewError(connect.CodeFailedPrecondition, err)
			}
			df.Steps[i].Context = p
		}
	}
	t := req.Template
	opts := build.Options{
		Steps: bc.Steps, Store: bc.Templates,
		Template: template.Template{
			ID: t.Id, Team: t.Team, Name: t.Name, CPUCount: int(t.CpuCount), MemoryMB: int(t.MemoryMb),
			StartCmd: t.StartCmd, ReadyCmd: t.ReadyCmd,
		},
		BuildArgs: req.BuildArgs,
		Insecure:  req.Insecure,
		Untrusted: req.Untrusted,
		Keychain:  bc.Keychain,
		Limits:    bc.Limits,
		Slots:     bc.Slots,
		Logger:    bc.Logger.With("template_id", t.Id, "build_id", req.BuildId),
	}
	if req.Context != "" {
		p, err := contextOf(req.Context)
		if err != nil {
			return connect.NewError(connect.CodeFailedPrecondition, err)
		}
		opts.ContextDir = p
	}
	lw := &lineWriter{send: func(lines []string) { fn(&nodev1.BuildEvent{Lines: lines}) }}
	opts.Log = lw
	res, err := build.Run(ctx, df, opts)
	lw.flush()
	if ctx.Err() != nil {
		return connect.NewError(connect.CodeCanceled, context.Cause(ctx))
	}
	out := &nodev1.BuildResult{FailedStep: -1}
	if err != nil {
		out.Error = err.Error()
		out.Invalid = errors.Is(err, buildspec.ErrInvalid)
		var se *build.StepError
		if errors.As(err, &se) {
			out.FailedStep, out.ExitCode = int32(se.Step), int32(max(se.ExitCode, 0))
		}
	} else {
		out.TemplateId, out.DurationMs = res.Template.ID, res.Duration.Milliseconds()
	}
	fn(&nodev1.BuildEvent{Result: out})
	return nil
}

func stepsFromWire(in []*nodev1.BuildStep) []buildspec.Step {
	out := make([]buildspec.Step, len(in))
	for i, s := range in {
		out[i] = buildspec.Step{Kind: s.Kind, Args: s.Args, Raw: s.Raw, Shell: s.Shell, User: s.User,
			Chown: s.Chown, Chmod: s.Chmod, Context: s.Context, Line: int(s.Line)}
	}
	return out
}

// lineWriter cuts a build's output into lines (a line longer than
// maxLineBytes into several) and sends each Write's complete ones. Steps
// may write from several goroutines.
type lineWriter struct {
	mu      sync.Mutex
	partial []byte
	send    func([]string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.partial = append(w.partial, p...)
	var lines []string
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			for len(w.partial) >= maxLineBytes {
				lines = append(lines, string(w.partial[:maxLineBytes]))
				w.partial = w.partial[maxLineBytes:]
			}
			break
		}
		lines = append(lines, strings.TrimRight(string(w.partial[:i]), "\r"))
		w.partial = w.partial[i+1:]
	}
	w.partial = append([]byte(nil), w.partial...)
	if len(lines) > 0 {
		w.send(lines)
	}
	return len(p), nil
}

func (w *lineWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.partial) > 0 {
		w.send([]string{string(w.partial)})
		w.partial = nil
	}
}
