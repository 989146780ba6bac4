// Package buildjob keeps template builds as cluster records: a record per
// build (its template, team, status, reason, the server that took it and
// the node that runs it) and the tail of its log, in the live state
// (package state), so that any API server answers a build's status and
// streams its log, and a build outlives neither silently: a build whose
// server stops, restarts or is gone, or whose node goes away, ends in
// error with that reason. The server that takes a build runs it on a node
// through the node API (Build, after PutBuildContext for its files) and
// owns the goroutine that follows it. The API imports this package; it
// imports the state, the node API's wire and buildspec, never the node.
// A template pull is a job of its own kind (KindPull), run by the node's
// Pull as a build is by its Build.
//
// A build's life:
//
//	Request ──> waiting ──Start──> building ──> ready
//	                                   └──────> error (reason)
//
// A template's latest build is kept (a new Request replaces a finished
// one); finished builds expire after Config.Retention.
package buildjob

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/aenvhq/aenv/internal/nodeapi"
	"github.com/aenvhq/aenv/internal/state"
)

// Status is where a build is, as E2B names it.
type Status string

// Build statuses.
const (
	Waiting  Status = "waiting"
	Building Status = "building"
	Ready    Status = "ready"
	Error    Status = "error"
)

// Finished says the build has ended.
func (s Status) Finished() bool { return s == Ready || s == Error }

// Errors; callers test with errors.Is.
var (
	// ErrNotFound: no such build (or not the template's latest).
	ErrNotFound = errors.New("build not found")
	// ErrBusy: the template is being built by another build.
	ErrBusy = errors.New("template is being built")
	// ErrStarted: the build was started already.
	ErrStarted = errors.New("build was started already")
)

// Entry is one line of a build's log (E2B's BuildLogEntry).
type Entry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// Reason says why a build failed (E2B's BuildStatusReason).
type Reason struct {
	Message    string  `json:"message"`
	Step       string  `json:"step,omitempty"`
	LogEntries []Entry `json:"logEntries"`
}

// Kind is what a job makes its template from.
type Kind string

// Job kinds.
const (
	// KindBuild runs a Dockerfile's steps (Spec.Dockerfile).
	KindBuild Kind = ""
	// KindPull unpacks an OCI image (Spec.Pull).
	KindPull Kind = "pull"
)

// Classes of a failed job's error (Record.Class), for the API to answer
// with the status each stands for.
const (
	ClassForbidden    = "forbidden"
	ClassTooLarge     = "too-large"
	ClassBadReference = "bad-reference"
	ClassNotFound     = "not-found"
	ClassUnauthorized = "unauthorized"
	ClassUnreachable  = "unreachable"
)

// Pulled describes the image a pull unpacked.
type Pulled struct {
	Digest string `json:"digest,omitempty"`
	Layers int    `json:"layers,omitempty"`
	Bytes  int64  `json:"bytes,omitempty"`
}

// Record is one build, as kept in the state. A pull is a build too (Kind),
// so that it is kept, dispatched and failed as builds are.
type Record struct {
	TemplateID string `json:"templateID"`
	BuildID    string `json:"buildID"`
	Kind       Kind   `json:"kind,omitempty"`
	// Team owns the build and the template it makes.
	Team     string   `json:"team"`
	Names    []string `json:"names"`
	CPUCount int      `json:"cpuCount,omitempty"`
	MemoryMB int      `json:"memoryMB,omitempty"`
	Status   Status   `json:"status"`
	Reason   *Reason  `json:"reason,omitempty"`
	// Server took the build (Config.Server); Node runs it.
	Server string `json:"server,omitempty"`
	Node   string `json:"node,omitempty"`
	// ExitCode is the exit status of the RUN that failed the build (0:
	// none); Invalid says the build was wrong as written.
	ExitCode int  `json:"exitCode,omitempty"`
	Invalid  bool `json:"invalid,omitempty"`
	// Class classifies a failure the node could name (Class*).
	Class string `json:"class,omitempty"`
	// Pulled is what a pull that ended well unpacked.
	Pulled   *Pulled   `json:"pulled,omitempty"`
	Created  time.Time `json:"created"`
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
}

// Duration is how long the build ran (so far).
func (r *Record) Duration() time.Duration {
	switch {
	case r.Started.IsZero():
		return 0
	case r.Finished.IsZero():
		return time.Since(r.Started)
	}
	return r.Finished.Sub(r.Started)
}

// Keys in the state.
const (
	recordPrefix = "builds/"
	logPrefix    = "buildlogs/"
	serverPrefix = "buildservers/"
)

func recordKey(templateID string) string { return recordPrefix + templateID }
func logKeys(buildID string) string      { return logPrefix + buildID + "/" }

// Config configures Open.
type Config struct {
	// State keeps the records.
	State state.Store
	// Server names this server, the same across its restarts (the
	// cluster's election candidate), so that a restarted server knows
	// the builds it left.
	Server string
	// Node picks the node a build runs on.
	Node func(ctx context.Context) (nodeapi.Node, error)
	// Limiter, when set, is asked before each build is dispatched, with
	// the build's team; release is called when the build ends. Pulls are
	// bounded per node instead, as they were per server before.
	Limiter func(ctx context.Context, team string) (release func(), err error)
	// Retention is how long finished builds are kept (0: a week); builds
	// never started go after a day.
	Retention time.Duration
	// SweepEvery is how often builds whose server is gone are failed and
	// expired ones removed (0: a minute).
	SweepEvery time.Duration
	Logger     *slog.Logger
}

// Jobs is this server's side of the cluster's builds. Its methods are
// safe for concurrent use.
type Jobs struct {
	cfg     Config
	log     *slog.Logger
	session state.Session
	// ctx ends on Close, and with it every build this server runs.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup
}

// errStopped ends the builds of a server that is closing.
var errStopped = errors.New("the server that ran it stopped")

// Open starts keeping builds: it says in the state that this server is
// alive (a lease), fails the builds an earlier run of it left unfinished,
// and sweeps the builds of servers that are gone until Close.
func Open(ctx context.Context, cfg Config) (*Jobs, error) {
	if cfg.Retention <= 0 {
		cfg.Retention = 7 * 24 * time.Hour
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	j := &Jobs{cfg: cfg, log: cfg.Logger}
	var err error
	if j.session, err = cfg.State.NewSession(context.WithoutCancel(ctx), 15*time.Second); err != nil {
		return nil, fmt.Errorf("opening build jobs: %w", err)
	}
	if _, err := cfg.State.Put(ctx, serverPrefix+cfg.Server, nil, state.WriteOptions{Lease: j.session.Lease()}); err != nil {
		j.session.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("opening build jobs: %w", err)
	}
	if err := j.failLeftovers(ctx); err != nil {
		j.log.Warn("failing the builds an earlier run left", "err", err)
	}
	j.ctx, j.cancel = context.WithCancelCause(context.WithoutCancel(ctx))
	j.wg.Add(1)
	go func() {
		defer j.wg.Done()
		j.sweepLoop()
	}()
	return j, nil
}

// Close ends the builds this server runs (each recorded as failed: the
// server stopped) and waits for them.
func (j *Jobs) Close(ctx context.Context) error {
	j.cancel(errStopped)
	j.wg.Wait()
	return j.session.Close(ctx)
}

// Request records a new build of r.TemplateID (waiting for Start),
// replacing the template's latest build unless that one is running
// (ErrBusy).
func (j *Jobs) Request(ctx context.Context, r Record) (*Record, error) {
	r.Status, r.Created, r.Reason = Waiting, time.Now().UTC(), nil
	r.Server, r.Node, r.Started, r.Finished = "", "", time.Time{}, time.Time{}
	val, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	for range 10 {
		old, rev, err := j.get(ctx, r.TemplateID)
		switch {
		case errors.Is(err, ErrNotFound):
			_, err = j.cfg.State.Create(ctx, recordKey(r.TemplateID), val, state.WriteOptions{})
		case err != nil:
			return nil, err
		case old.Status == Building:
			return nil, fmt.Errorf("requesting a build of %s: %w (build %s)", r.TemplateID, ErrBusy, old.BuildID)
		default:
			if _, err = j.cfg.State.Update(ctx, recordKey(r.TemplateID), val, rev, state.WriteOptions{}); err == nil {
				j.deleteLog(ctx, old.BuildID)
			}
		}
		if errors.Is(err, state.ErrExists) || errors.Is(err, state.ErrConflict) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("requesting a build of %s: %w", r.TemplateID, err)
		}
		return &r, nil
	}
	return nil, fmt.Errorf("requesting a build of %s: %w", r.TemplateID, state.ErrConflict)
}

// Get returns the latest build of templateID. A build whose server is
// gone is failed first.
func (j *Jobs) Get(ctx context.Context, templateID string) (*Record, error) {
	r, _, err := j.get(ctx, templateID)
	if err != nil {
		return nil, err
	}
	if r.Status == Building && r.Server != j.cfg.Server && !j.serverAlive(ctx, r.Server) {
		return j.failOrphan(ctx, r)
	}
	return r, nil
}

// Lookup returns build buildID of templateID (ErrNotFound unless it is
// the template's latest).
func (j *Jobs) Lookup(ctx context.Context, templateID, buildID string) (*Record, error) {
	r, err := j.Get(ctx, templateID)
	if err != nil {
		return nil, err
	}
	if r.BuildID != buildID {
		return nil, fmt.Errorf("build %s of template %s: %w", buildID, templateID, ErrNotFound)
	}
	return r, nil
}

func (j *Jobs) get(ctx context.Context, templateID string) (*Record, int64, error) {
	e, err := j.cfg.State.Get(ctx, recordKey(templateID))
	if errors.Is(err, state.ErrNotFound) {
		return nil, 0, fmt.Errorf("build of template %s: %w", templateID, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading the build of template %s: %w", templateID, err)
	}
	var r Record
	if err := json.Unmarshal(e.Value, &r); err != nil {
		return nil, 0, fmt.Errorf("reading the build of template %s: %w", templateID, err)
	}
	return &r, e.Revision, nil
}

// mutate applies fn to build buildID's record, compare-and-swap; fn
// returning false leaves the record as it is. It returns the record as
// it ends up.
func (j *Jobs) mutate(ctx context.Context, templateID, buildID string, fn func(*Record) bool) (*Record, error) {
	for range 20 {
		r, rev, err := j.get(ctx, templateID)
		if err != nil {
			return nil, err
		}
		if r.BuildID != buildID {
			return nil, fmt.Errorf("build %s of template %s: %w (replaced by %s)", buildID, templateID, ErrNotFound, r.BuildID)
		}
		if !fn(r) {
			return r, nil
		}
		val, err := json.Marshal(r)
		if err != nil {
			return nil, err
		}
		_, err = j.cfg.State.Update(ctx, recordKey(templateID), val, rev, state.WriteOptions{})
		if errors.Is(err, state.ErrConflict) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("updating build %s: %w", buildID, err)
		}
		return r, nil
	}
	return nil, fmt.Errorf("updating build %s: %w", buildID, state.ErrConflict)
}

// fail ends build r in error with msg (unless it has ended already),
// adding msg to its log and the log's last entries to the reason.
func (j *Jobs) fail(ctx context.Context, r *Record, step, msg string) (*Record, error) {
	var tail []Entry
	if entries, _, err := j.Logs(ctx, r.BuildID, 0, -1); err == nil {
		tail = entries[max(0, len(entries)-reasonEntries+1):]
	}
	e := Entry{Timestamp: time.Now().UTC(), Level: "error", Message: msg}
	// The message ends the log too, as the build's own failures do.
	j.appendChunk(ctx, r.BuildID, []Entry{e})
	tail = append(tail, e)
	return j.mutate(ctx, r.TemplateID, r.BuildID, func(r *Record) bool {
		if r.Status.Finished() {
			return false
		}
		r.Status, r.Finished = Error, time.Now().UTC()
		r.Reason = &Reason{Message: msg, Step: step, LogEntries: tail}
		return true
	})
}

// serverAlive says whether server holds its lease.
func (j *Jobs) serverAlive(ctx context.Context, server string) bool {
	_, err := j.cfg.State.Get(ctx, serverPrefix+server)
	// A store that cannot answer fails nothing.
	return !errors.Is(err, state.ErrNotFound)
}

func (j *Jobs) failOrphan(ctx context.Context, r *Record) (*Record, error) {
	j.log.Warn("failing a build whose server is gone", "build_id", r.BuildID, "template_id", r.TemplateID, "server", r.Server)
	return j.fail(ctx, r, "finalize", fmt.Sprintf("the server that ran build %s (%s) is gone", r.BuildID, r.Server))
}

// failLeftovers fails the builds an earlier run of this server left
// running: a build does not outlive the server that follows it.
func (j *Jobs) failLeftovers(ctx context.Context) error {
	recs, err := j.list(ctx)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if r.Status == Building && r.Server == j.cfg.Server {
			j.log.Warn("failing a build this server left running when it stopped", "build_id", r.BuildID, "template_id", r.TemplateID)
			if _, err := j.fail(ctx, r, "finalize", fmt.Sprintf("the server that ran build %s (%s) restarted", r.BuildID, r.Server)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (j *Jobs) list(ctx context.Context) ([]*Record, error) {
	entries, _, err := j.cfg.State.List(ctx, recordPrefix)
	if err != nil {
		return nil, fmt.Errorf("listing builds: %w", err)
	}
	out := make([]*Record, 0, len(entries))
	for _, e := range entries {
		var r Record
		if err := json.Unmarshal(e.Value, &r); err == nil {
			out = append(out, &r)
		}
	}
	return out, nil
}

func (j *Jobs) sweepLoop() {
	t := time.NewTicker(j.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-j.ctx.Done():
			return
		case <-t.C:
			if err := j.Sweep(j.ctx, time.Now()); err != nil && j.ctx.Err() == nil {
				j.log.Warn("sweeping builds", "err", err)
			}
		}
	}
}

// Sweep fails the running builds whose server is gone and removes, with
// their logs, finished builds older than Retention and builds requested
// more than a day before now and never started.
func (j *Jobs) Sweep(ctx context.Context, now time.Time) error {
	recs, err := j.list(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range recs {
		switch {
		case r.Status == Building && r.Server != j.cfg.Server && !j.serverAlive(ctx, r.Server):
			_, err = j.failOrphan(ctx, r)
		case r.Status.Finished() && now.Sub(r.Finished) > j.cfg.Retention,
			r.Status == Waiting && now.Sub(r.Created) > 24*time.Hour:
			err = j.remove(ctx, r)
		default:
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// remove deletes build r's record, if it is still the template's latest
// and unchanged, then its log.
func (j *Jobs) remove(ctx context.Context, r *Record) error {
	cur, rev, err := j.get(ctx, r.TemplateID)
	if err != nil || cur.BuildID != r.BuildID || cur.Status != r.Status {
		return nil
	}
	if err := j.cfg.State.Delete(ctx, recordKey(r.TemplateID), rev); err != nil && !errors.Is(err, state.ErrConflict) && !errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("removing build %s: %w", r.BuildID, err)
	}
	j.deleteLog(ctx, r.BuildID)
	return nil
}
