package buildjob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/nodeapi/nodev1"
)

// Spec is what a build does: a Dockerfile's steps, or (a job of
// KindPull) a pull.
type Spec struct {
	Dockerfile *buildspec.Dockerfile
	// Pull is what a pull unpacks; its upload, if any, is one of
	// Contexts.
	Pull *PullSpec
	// Contexts are the build's files on this server by name (a step's
	// Context, Context): they are sent to the node before the build.
	Contexts map[string]string
	// Context names the context of the Dockerfile's COPY steps.
	Context            string
	BuildArgs          map[string]string
	Insecure           bool
	Untrusted          bool
	StartCmd, ReadyCmd string
	// Lines, when set, is called with the build's log lines as the node
	// sends them (the log is kept in the state besides), so that the
	// client of this server sees them at once.
	Lines func([]string)
	// Done, when set, is called once the build has ended (with its
	// outcome as recorded).
	Done func(*Record)
}

// PullSource is where a pull's image is.
type PullSource string

// Pull sources.
const (
	FromRegistry      PullSource = ""
	FromOCILayout     PullSource = "oci"
	FromDockerArchive PullSource = "docker-archive"
)

// PullSpec is what a pull unpacks.
type PullSpec struct {
	Source PullSource
	// Ref is the registry image's reference, or names the image in an
	// upload that holds several (empty: its only one).
	Ref string
	// Context names the upload among Spec.Contexts: for FromOCILayout
	// the layout directory, for FromDockerArchive a directory holding
	// the tarball as image.tar.
	Context string
	// Insecure allows plain HTTP and unverified TLS to the registry;
	// PublicOnly refuses registries at non-public addresses (a client's
	// pull).
	Insecure, PublicOnly bool
	// Progress, when set, is told how the pull advances, on this server
	// only (progress is not kept in the state). Calls never overlap.
	Progress func(Progress)
}

// Progress is one step of a pull (image.Progress, from the node).
type Progress struct {
	Layer, Layers                          int
	Digest                                 string
	Fetched, Applied, Total                int64
	Unpacked                               bool
	ImageFetched, ImageApplied, ImageTotal int64
}

// outcome is how a node said a build or pull ended.
type outcome struct {
	err      string
	exitCode int
	invalid  bool
	class    string
	pulled   *Pulled
}

// chunkSize is how much of a context one PutBuildContext carries.
const chunkSize = 1 << 20

// Start runs build buildID of templateID, requested before, on a node,
// in the background: it is this server's until it ends (Close cancels
// it). ErrStarted if it was started already.
func (j *Jobs) Start(ctx context.Context, templateID, buildID string, spec Spec) error {
	if j.ctx.Err() != nil {
		return fmt.Errorf("starting build %s: %w", buildID, context.Cause(j.ctx))
	}
	var was Status
	rec, err := j.mutate(ctx, templateID, buildID, func(r *Record) bool {
		if was = r.Status; was != Waiting {
			return false
		}
		r.Status, r.Server, r.Started = Building, j.cfg.Server, time.Now().UTC()
		return true
	})
	if err != nil {
		return fmt.Errorf("starting build %s: %w", buildID, err)
	}
	if was != Waiting {
		return fmt.Errorf("starting build %s: %w (%s)", buildID, ErrStarted, was)
	}
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		out := j.run(rec, spec)
		if spec.Done != nil {
			spec.Done(out)
		}
	}()
	return nil
}

// run follows build rec on a node until it ends, and records how.
func (j *Jobs) run(rec *Record, spec Spec) *Record {
	ctx := j.ctx
	log := j.log.With("build_id", rec.BuildID, "template_id", rec.TemplateID)
	lw := newLogWriter(j.cfg.State, rec.BuildID)
	flushed := make(chan struct{})
	stopFlush := make(chan struct{})
	go func() {
		defer close(flushed)
		t := time.NewTicker(flushEvery)
		defer t.Stop()
		for {
			select {
			case <-stopFlush:
				return
			case <-t.C:
				lw.flushIfDue(ctx)
			}
		}
	}()
	res, step, err := j.dispatch(ctx, rec, spec, lw)
	close(stopFlush)
	<-flushed

	// The outcome is written even when this server is closing.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	msg := ""
	switch {
	case ctx.Err() != nil:
		msg = fmt.Sprintf("build %s was cancelled: %v", rec.BuildID, context.Cause(ctx))
	case err != nil:
		msg = err.Error()
	case res.err != "":
		msg = res.err
	}
	if msg != "" {
		lw.add(fctx, "error", msg)
	}
	if err := lw.flush(fctx); err != nil {
		log.Warn("writing a build's log", "err", err)
	}
	out, err := j.mutate(fctx, rec.TemplateID, rec.BuildID, func(r *Record) bool {
		if r.Status.Finished() {
			return false // failed meanwhile by a server that thought this one gone
		}
		r.Finished = time.Now().UTC()
		if msg == "" {
			r.Status, r.Pulled = Ready, res.pulled
			return true
		}
		r.Status = Error
		r.Reason = &Reason{Message: msg, Step: step, LogEntries: lw.lastEntries()}
		if res != nil {
			r.ExitCode, r.Invalid, r.Class = res.exitCode, res.invalid, res.class
		}
		return true
	})
	if err != nil {
		log.Error("recording how a build ended", "err", err)
		return rec
	}
	if msg != "" {
		log.Warn("template build failed", "kind", out.Kind, "node_id", out.Node, "err", msg)
	} else {
		log.Info("template build finished", "kind", out.Kind, "node_id", out.Node, "took", out.Duration().Round(time.Millisecond))
	}
	return out
}

// dispatch runs the build on a node: its outcome, or the error that kept
// it from one, and the step a failure is in ("base" for FROM and pulls,
// "finalize" outside the steps).
func (j *Jobs) dispatch(ctx context.Context, rec *Record, spec Spec, lw *logWriter) (*outcome, string, error) {
	if j.cfg.Limiter != nil && rec.Kind != KindPull {
		release, err := j.cfg.Limiter(ctx, rec.Team)
		if err != nil {
			return nil, "base", fmt.Errorf("building template %s: %w", rec.TemplateID, err)
		}
		defer release()
	}
	n, err := j.cfg.Node(ctx)
	if err != nil {
		return nil, "base", fmt.Errorf("choosing a node for build %s: %w", rec.BuildID, err)
	}
	if _, err := j.mutate(ctx, rec.TemplateID, rec.BuildID, func(r *Record) bool {
		r.Node = n.ID()
		return true
	}); err != nil {
		return nil, "base", err
	}
	for name, dir := range spec.Contexts {
		if err := sendContext(ctx, n, rec.BuildID, name, dir); err != nil {
			return nil, "base", fmt.Errorf("sending the files of build %s to node %s: %w", rec.BuildID, n.ID(), err)
		}
	}
	lines := func(ls []string) {
		if len(ls) == 0 {
			return
		}
		lw.add(ctx, "info", ls...)
		if spec.Lines != nil {
			spec.Lines(ls)
		}
	}
	if spec.Pull != nil {
		res, err := j.pull(ctx, n, rec, spec, lines)
		return res, "base", err
	}
	var res *nodev1.BuildResult
	err = n.Build(ctx, toWire(rec, spec), func(ev *nodev1.BuildEvent) {
		lines(ev.Lines)
		if ev.Result != nil {
			res = ev.Result
		}
	})
	if err != nil {
		return nil, "finalize", j.nodeGone(ctx, n, rec, err)
	}
	step := "finalize"
	switch {
	case res.FailedStep == 0:
		step = "base"
	case res.FailedStep > 0:
		step = strconv.Itoa(int(res.FailedStep))
	}
	return &outcome{err: res.Error, exitCode: int(res.ExitCode), invalid: res.Invalid}, step, nil
}

// nodeGone is the error of a build whose stream to node n broke.
func (j *Jobs) nodeGone(ctx context.Context, n nodeapi.Node, rec *Record, err error) error {
	if ctx.Err() != nil {
		return err
	}
	return fmt.Errorf("node %s, which ran build %s, went away: %s", n.ID(), rec.BuildID, nodeapi.Message(err))
}

// pull runs pull rec on node n.
func (j *Jobs) pull(ctx context.Context, n nodeapi.Node, rec *Record, spec Spec, lines func([]string)) (*outcome, error) {
	p := spec.Pull
	req := &nodev1.PullRequest{
		PullId: rec.BuildID, Template: templateToWire(rec, spec),
		Ref: p.Ref, Context: p.Context, Insecure: p.Insecure, PublicOnly: p.PublicOnly,
	}
	switch p.Source {
	case FromRegistry:
	case FromOCILayout:
		req.Source = nodev1.PullRequest_SOURCE_OCI
	case FromDockerArchive:
		req.Source = nodev1.PullRequest_SOURCE_DOCKER_ARCHIVE
	default:
		return nil, fmt.Errorf("pulling template %s: unknown source %q", rec.TemplateID, p.Source)
	}
	var res *nodev1.PullResult
	err := n.Pull(ctx, req, func(ev *nodev1.PullEvent) {
		lines(ev.Lines)
		if e := ev.Progress; e != nil && p.Progress != nil {
			p.Progress(Progress{
				Layer: int(e.Layer), Layers: int(e.Layers), Digest: e.Digest,
				Fetched: e.Fetched, Applied: e.Applied, Total: e.Total, Unpacked: e.Unpacked,
				ImageFetched: e.ImageFetched, ImageApplied: e.ImageApplied, ImageTotal: e.ImageTotal,
			})
		}
		if ev.Result != nil {
			res = ev.Result
		}
	})
	if err != nil {
		return nil, j.nodeGone(ctx, n, rec, err)
	}
	out := &outcome{err: res.Error, class: classes[res.ErrorClass]}
	if res.ErrorClass == nodev1.PullResult_ERROR_CLASS_INVALID {
		out.invalid = true
	}
	if res.Error == "" {
		out.pulled = &Pulled{Digest: res.Digest, Layers: int(res.Layers), Bytes: res.Bytes}
	}
	return out, nil
}

// classes name the node's error classes of pulls.
var classes = map[nodev1.PullResult_ErrorClass]string{
	nodev1.PullResult_ERROR_CLASS_FORBIDDEN:     ClassForbidden,
	nodev1.PullResult_ERROR_CLASS_TOO_LARGE:     ClassTooLarge,
	nodev1.PullResult_ERROR_CLASS_BAD_REFERENCE: ClassBadReference,
	nodev1.PullResult_ERROR_CLASS_NOT_FOUND:     ClassNotFound,
	nodev1.PullResult_ERROR_CLASS_UNAUTHORIZED:  ClassUnauthorized,
	nodev1.PullResult_ERROR_CLASS_UNREACHABLE:   ClassUnreachable,
}

// sendContext sends the tree at dir to node n as context name of build
// buildID, in chunks.
func sendContext(ctx context.Context, n nodeapi.Node, buildID, name, dir string) error {
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := buildspec.PackContext(pw, dir)
		pw.CloseWithError(err)
		done <- err
	}()
	defer func() {
		pr.Close()
		<-done
	}()
	buf := make([]byte, chunkSize)
	var off int64
	for {
		k, err := io.ReadFull(pr, buf)
		last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !last {
			return err
		}
		if _, err := n.PutBuildContext(ctx, &nodev1.PutBuildContextRequest{
			BuildId: buildID, Name: name, Offset: off, Data: buf[:k], Last: last,
		}); err != nil {
			return err
		}
		off += int64(k)
		if last {
			return nil
		}
	}
}

func templateToWire(rec *Record, spec Spec) *nodev1.BuildTemplate {
	name := rec.TemplateID
	if len(rec.Names) > 0 {
		name = rec.Names[0]
	}
	return &nodev1.BuildTemplate{
		Id: rec.TemplateID, Team: rec.Team, Name: name,
		CpuCount: int32(rec.CPUCount), MemoryMb: int32(rec.MemoryMB),
		StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd,
	}
}

func toWire(rec *Record, spec Spec) *nodev1.BuildRequest {
	df := spec.Dockerfile
	return &nodev1.BuildRequest{
		BuildId:  rec.BuildID,
		Template: templateToWire(rec, spec),
		From:     df.From, FromKind: int32(df.FromKind), FromLine: int32(df.FromLine),
		PreArgs: stepsToWire(df.PreArgs), User: df.User, Workdir: df.Workdir,
		Steps:     stepsToWire(df.Steps),
		Context:   spec.Context,
		BuildArgs: spec.BuildArgs,
		Insecure:  spec.Insecure,
		Untrusted: spec.Untrusted,
	}
}

func stepsToWire(in []buildspec.Step) []*nodev1.BuildStep {
	out := make([]*nodev1.BuildStep, len(in))
	for i, s := range in {
		out[i] = &nodev1.BuildStep{Kind: s.Kind, Args: s.Args, Raw: s.Raw, Shell: s.Shell, User: s.User,
			Chown: s.Chown, Chmod: s.Chmod, Context: s.Context, Line: int32(s.Line)}
	}
	return out
}

// Follow calls fn with build buildID's new log entries, from offset on,
// until the build has ended (its record is returned) or ctx ends. It
// polls the records, so that it follows a build any server runs.
func (j *Jobs) Follow(ctx context.Context, templateID, buildID string, offset int, fn func([]Entry)) (*Record, error) {
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		// The record first: a build seen ended has its whole log written.
		rec, err := j.Lookup(ctx, templateID, buildID)
		if err != nil {
			return nil, err
		}
		entries, first, err := j.Logs(ctx, buildID, offset, -1)
		if err != nil {
			return nil, err
		}
		if len(entries) > 0 {
			offset = first + len(entries)
			fn(entries)
		}
		if rec.Status.Finished() {
			return rec, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}
