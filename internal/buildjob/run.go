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

// Spec is what a build does.
type Spec struct {
	Dockerfile *buildspec.Dockerfile
	// Contexts are the build's files on this server by name (a step's
	// Context, Context): they are sent to the node before the build.
	Contexts map[string]string
	// Context names the context of the Dockerfile's COPY steps.
	Context            string
	BuildArgs          map[string]string
	Insecure           bool
	Untrusted          bool
	StartCmd, ReadyCmd string
	// Done, when set, is called once the build has ended (with its
	// outcome as recorded).
	Done func(*Record)
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
	case res.Error != "":
		msg = res.Error
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
			r.Status = Ready
			return true
		}
		r.Status = Error
		r.Reason = &Reason{Message: msg, Step: step, LogEntries: lw.lastEntries()}
		if res != nil {
			r.ExitCode, r.Invalid = int(res.ExitCode), res.Invalid
		}
		return true
	})
	if err != nil {
		log.Error("recording how a build ended", "err", err)
		return rec
	}
	if msg != "" {
		log.Warn("template build failed", "node_id", out.Node, "err", msg)
	} else {
		log.Info("template build finished", "node_id", out.Node, "took", out.Duration().Round(time.Millisecond))
	}
	return out
}

// dispatch runs the build on a node: its result, or the error that kept
// it from one, and the step a failure is in ("base" for FROM, "finalize"
// outside the steps).
func (j *Jobs) dispatch(ctx context.Context, rec *Record, spec Spec, lw *logWriter) (*nodev1.BuildResult, string, error) {
	if j.cfg.Limiter != nil {
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
	var res *nodev1.BuildResult
	err = n.Build(ctx, toWire(rec, spec), func(ev *nodev1.BuildEvent) {
		if len(ev.Lines) > 0 {
			lw.add(ctx, "info", ev.Lines...)
		}
		if ev.Result != nil {
			res = ev.Result
		}
	})
	switch {
	case err != nil && ctx.Err() == nil:
		return nil, "finalize", fmt.Errorf("node %s, which ran build %s, went away: %s", n.ID(), rec.BuildID, nodeapi.Message(err))
	case err != nil:
		return nil, "finalize", err
	}
	step := "finalize"
	switch {
	case res.FailedStep == 0:
		step = "base"
	case res.FailedStep > 0:
		step = strconv.Itoa(int(res.FailedStep))
	}
	return res, step, nil
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

func toWire(rec *Record, spec Spec) *nodev1.BuildRequest {
	df := spec.Dockerfile
	name := rec.TemplateID
	if len(rec.Names) > 0 {
		name = rec.Names[0]
	}
	return &nodev1.BuildRequest{
		BuildId: rec.BuildID,
		Template: &nodev1.BuildTemplate{
			Id: rec.TemplateID, Team: rec.Team, Name: name,
			CpuCount: int32(rec.CPUCount), MemoryMb: int32(rec.MemoryMB),
			StartCmd: spec.StartCmd, ReadyCmd: spec.ReadyCmd,
		},
		From: df.From, FromKind: int32(df.FromKind), FromLine: int32(df.FromLine),
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
