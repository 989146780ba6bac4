// Package build makes templates from Dockerfiles (a subset: one FROM,
// then RUN, ENV, ARG, WORKDIR, USER, COPY) and from the equivalent step
// lists the E2B template API sends. It starts from an OCI image (pulled
// with the image package) or a copy of an existing template, runs each RUN
// in a gVisor sandbox writing straight into the staged root filesystem,
// and publishes the result atomically as a template. It runs on the node
// that takes a build job (node/nodeserver, for buildjob's dispatch) and in
// the CLI's local build; the control plane links only buildspec.
package build

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/aenvhq/aenv/internal/buildspec"
	"github.com/aenvhq/aenv/internal/image"
	"github.com/aenvhq/aenv/internal/runtime"
	"github.com/aenvhq/aenv/internal/template"
)

// defaultPath is the PATH of RUN steps when the build sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Options configures Run.
type Options struct {
	// Steps runs the RUN and COPY steps (the node's runtime driver).
	Steps Stepper
	// Store receives the template.
	Store *template.Catalog
	// Template is what to publish: its ID names the template (replacing
	// one of that name once the new one is complete); resources, aliases
	// and start/ready commands are recorded as given (zero resources get
	// image.Pull's defaults). Run fills in Image and CreatedAt.
	Template template.Template
	// ContextDir is where COPY sources are read from; COPY fails without
	// one.
	ContextDir string
	// BuildArgs set declared ARGs (--build-arg).
	BuildArgs map[string]string
	// Insecure allows plain HTTP and unverified TLS to the registry of a
	// FROM image.
	Insecure bool
	// Untrusted marks a build a client asked for without the operator's
	// trust (an admin key): its FROM may name neither files on this host
	// (oci:, docker-archive:) nor a registry at a private, loopback or
	// link-local address (image.CheckClientRef, PullOptions.PublicOnly).
	Untrusted bool
	// Keychain holds the registry credentials the operator gave the
	// server; nil pulls FROM images anonymously.
	Keychain authn.Keychain
	// Limits bound what the build may take of the host.
	Limits Limits
	// Slots, when set, bounds how many builds run at once; Run waits for
	// one first, saying so on Log.
	Slots *Slots
	// Log receives the build's output: a line per step and what its
	// commands print.
	Log io.Writer
	// Logger receives debug detail; nil discards it.
	Logger *slog.Logger
}

// ErrInvalid classifies builds that are wrong as written: a bad
// instruction, an unknown FROM, a COPY outside the context.
var ErrInvalid = buildspec.ErrInvalid

// StepError is a build step that failed. ExitCode is the exit status of a
// RUN (or of the copy behind a COPY), -1 when no command ran or a bound of
// the build ended it (Err says which: ErrOutOfMemory, ErrDiskFull).
type StepError struct {
	// Step is the failed step's index, from 1; 0 is FROM.
	Step, Steps int
	// Instruction is the step as a Dockerfile line.
	Instruction string
	// Line is the step's line in the Dockerfile, 0 if unknown.
	Line     int
	ExitCode int
	Err      error
}

func (e *StepError) Error() string {
	where := fmt.Sprintf("step %d/%d", e.Step, e.Steps)
	if e.Line > 0 {
		where += fmt.Sprintf(" (line %d)", e.Line)
	}
	if e.ExitCode >= 0 {
		return fmt.Sprintf("%s %s: exited with code %d", where, e.Instruction, e.ExitCode)
	}
	return fmt.Sprintf("%s %s: %v", where, e.Instruction, e.Err)
}

func (e *StepError) Unwrap() error { return e.Err }

// Result describes a finished build.
type Result struct {
	// Template is the published template.
	Template *template.Template
	// Duration is how long the build took.
	Duration time.Duration
}

// state is what the steps so far have set.
type state struct {
	env     []string // KEY=VALUE, recorded in the template
	args    map[string]string
	argSet  map[string]bool
	workdir string
	user    string
	cmd     []string
	entry   []string
}

func (s *state) lookup(name string) (string, bool) {
	for i := len(s.env) - 1; i >= 0; i-- {
		if k, v, _ := strings.Cut(s.env[i], "="); k == name {
			return v, true
		}
	}
	if s.argSet[name] {
		return s.args[name], true
	}
	return "", false
}

func (s *state) setEnv(k, v string) {
	for i, kv := range s.env {
		if name, _, _ := strings.Cut(kv, "="); name == k {
			s.env[i] = k + "=" + v
			return
		}
	}
	s.env = append(s.env, k+"="+v)
}

// Run builds df into template opts.Template.ID. A failing step stops the
// build with a *StepError; a build that fails or is cancelled leaves no
// template and no partial files, and leaves an existing template of the
// same name untouched. It runs within opts.Limits, once opts.Slots has
// room for it.
func Run(ctx context.Context, df *Dockerfile, opts Options) (*Result, error) {
	tpl := opts.Template
	if opts.Store == nil {
		return nil, errors.New("building template: no template store")
	}
	if !template.ValidID(tpl.ID) {
		return nil, fmt.Errorf("building template %q: %w: name is invalid (lower-case letters, digits, '.', '_' and '-', at most 63, starting with a letter or digit)", tpl.ID, ErrInvalid)
	}
	if tpl.ID == template.BaseID {
		return nil, fmt.Errorf("building template %s: %w: the name is reserved for the built-in base template", tpl.ID, ErrInvalid)
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	fail := func(err error) (*Result, error) {
		return nil, fmt.Errorf("building template %s: %w", tpl.ID, err)
	}
	r, err := newRunner(opts)
	if err != nil {
		return fail(err)
	}
	release, err := opts.Slots.Acquire(ctx, opts.Log)
	if err != nil {
		return fail(err)
	}
	defer release()
	start := time.Now()
	lim := opts.Limits
	if lim.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, lim.Timeout, fmt.Errorf("%w after %s", ErrTimeout, shortDuration(lim.Timeout)))
		defer cancel()
	}

	stage, err := opts.Store.NewStage(tpl.ID)
	if err != nil {
		return fail(err)
	}
	defer stage.Abort()
	// The tree is written to the build's own disk when it has one, and
	// copied into the stage once complete.
	root, scratch := stage.RootFS(), stage.ScratchDir()
	var dsk *disk
	if lim.DiskBytes > 0 {
		if dsk, err = newDisk(ctx, lim.DiskDir, lim.DiskBytes); err != nil {
			return fail(err)
		}
		defer func() {
			if err := dsk.remove(); err != nil {
				opts.Logger.Warn("removing a build disk", "template_id", tpl.ID, "err", err)
			}
		}()
		root, scratch = dsk.root(), dsk.scratch()
	}
	// bounded says which bound a failure is due to, if any: the time
	// limit (or the caller's cancel), a step killed for its memory, a
	// full disk.
	bounded := func(code int, err error) (int, error) {
		switch {
		case ctx.Err() != nil:
			return -1, context.Cause(ctx)
		case errors.Is(err, runtime.ErrOutOfMemory):
			return -1, fmt.Errorf("%w (%d MiB)", ErrOutOfMemory, lim.MemoryMB)
		case dsk != nil && dsk.full():
			return -1, fmt.Errorf("%w (%s)", ErrDiskFull, diskString(lim.DiskBytes))
		}
		return code, err
	}

	total := len(df.Steps)
	st := &state{args: map[string]string{}, argSet: map[string]bool{}}
	// ARGs before FROM may only be used in FROM.
	pre := &state{args: map[string]string{}, argSet: map[string]bool{}}
	for _, a := range df.PreArgs {
		if err := applyArg(pre, a, opts.BuildArgs); err != nil {
			return fail(&StepError{Step: 0, Steps: total, Instruction: a.String(), Line: a.Line, ExitCode: -1, Err: err})
		}
	}
	from := df.From
	if len(df.PreArgs) > 0 {
		w, err := buildspec.Words(from, pre.lookup)
		if err != nil || len(w) != 1 {
			return fail(&StepError{Step: 0, Steps: total, Instruction: "FROM " + df.From, Line: df.FromLine, ExitCode: -1,
				Err: fmt.Errorf("%w: cannot expand %q", ErrInvalid, df.From)})
		}
		from = w[0]
	}
	fmt.Fprintf(opts.Log, "Step 0/%d : FROM %s\n", total, from)
	imgCfg, err := prepareRoot(ctx, root, scratch, from, df.FromKind, opts)
	if err != nil {
		if _, err = bounded(-1, err); ctx.Err() != nil {
			return fail(err)
		}
		return fail(&StepError{Step: 0, Steps: total, Instruction: "FROM " + from, Line: df.FromLine, ExitCode: -1, Err: err})
	}
	st.env = append(st.env, imgCfg.Env...)
	st.workdir, st.user = imgCfg.WorkingDir, imgCfg.User
	st.cmd, st.entry = imgCfg.Cmd, imgCfg.Entrypoint
	if df.User != "" {
		st.user = df.User
	}
	if df.Workdir != "" {
		st.workdir = df.Workdir
	}

	for i, step := range df.Steps {
		if ctx.Err() != nil {
			return fail(context.Cause(ctx))
		}
		fmt.Fprintf(opts.Log, "Step %d/%d : %s\n", i+1, total, step)
		code, err := runStep(ctx, r, root, st, step, opts)
		if err != nil || code != 0 {
			code, err = bounded(code, err)
			if ctx.Err() != nil {
				return fail(err)
			}
			if err == nil {
				err = fmt.Errorf("exit code %d", code)
			}
			return fail(&StepError{Step: i + 1, Steps: total, Instruction: step.String(), Line: step.Line, ExitCode: code, Err: err})
		}
	}
	if err := r.removeMountPoints(root); err != nil {
		return fail(err)
	}
	if dsk != nil {
		// cp -a keeps owners, modes, links, devices, times and xattrs.
		cmd := exec.CommandContext(ctx, "cp", "-a", "--", root+"/.", stage.RootFS()+"/")
		if out, err := cmd.CombinedOutput(); err != nil {
			if ctx.Err() != nil {
				return fail(context.Cause(ctx))
			}
			return fail(fmt.Errorf("copying the built tree into the template store: %w: %s", err, strings.TrimSpace(string(out))))
		}
	}
	for k := range opts.BuildArgs {
		if _, declared := st.argSet[k]; !declared {
			if _, pre := pre.argSet[k]; !pre {
				fmt.Fprintf(opts.Log, "warning: build argument %s was not declared with ARG and is unused\n", k)
			}
		}
	}

	if tpl.CPUCount <= 0 {
		tpl.CPUCount = image.DefaultCPUCount
	}
	if tpl.MemoryMB <= 0 {
		tpl.MemoryMB = image.DefaultMemoryMB
	}
	tpl.CreatedAt = time.Now().UTC()
	tpl.RootFS = ""
	tpl.Image = &template.ImageConfig{
		Ref:        from,
		Digest:     imgCfg.Digest,
		Env:        st.env,
		WorkingDir: st.workdir,
		User:       st.user,
		Entrypoint: st.entry,
		Cmd:        st.cmd,
	}
	if err := stage.Commit(&tpl); err != nil {
		return fail(err)
	}
	published, err := opts.Store.Get(tpl.ID)
	if err != nil {
		return fail(fmt.Errorf("reading back: %w", err))
	}
	if ss, ok := opts.Steps.(ServiceStarter); ok && tpl.StartCmd != "" {
		if err := ss.StartService(ctx, tpl.ID, opts.Log); err != nil {
			return nil, fmt.Errorf("building template %s: its start command: %w", tpl.ID, err)
		}
	}
	fmt.Fprintf(opts.Log, "Built template %s in %s\n", tpl.ID, time.Since(start).Round(100*time.Millisecond))
	return &Result{Template: published, Duration: time.Since(start)}, nil
}

// prepareRoot fills root, the build's tree, from the FROM: a copy of a
// template, or an image unpacked into it (its downloads spooled in
// scratch). It returns the configuration the build inherits.
func prepareRoot(ctx context.Context, root, scratch, from string, kind FromKind, opts Options) (template.ImageConfig, error) {
	var cfg template.ImageConfig
	if kind == FromAuto || kind == FromTemplate {
		t, err := opts.Store.Get(from)
		if err == nil && t.Remote {
			// Published by another host: its files come from the store.
			fmt.Fprintf(opts.Log, "fetching template %s from the store\n", t.ID)
			t, err = opts.Store.Fetch(ctx, from)
		}
		switch {
		case err == nil:
			fmt.Fprintf(opts.Log, "copying template %s\n", t.ID)
			// cp -a keeps owners, modes, links, devices and times.
			cmd := exec.CommandContext(ctx, "cp", "-a", "--", t.RootFS+"/.", root+"/")
			if out, err := cmd.CombinedOutput(); err != nil {
				return cfg, fmt.Errorf("copying template %s: %w: %s", t.ID, err, strings.TrimSpace(string(out)))
			}
			if t.Image != nil {
				cfg = *t.Image
				cfg.Env = append([]string(nil), t.Image.Env...)
			}
			cfg.Digest = ""
			return cfg, nil
		case kind == FromTemplate || from == template.BaseID || !errors.Is(err, template.ErrNotFound):
			return cfg, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	if opts.Untrusted {
		if err := image.CheckClientRef(ctx, from); err != nil {
			return cfg, err
		}
	}
	fmt.Fprintf(opts.Log, "pulling image %s\n", from)
	res, err := image.UnpackTo(ctx, from, root, scratch, image.PullOptions{
		Insecure:   opts.Insecure,
		Keychain:   opts.Keychain,
		MaxBytes:   opts.Limits.MaxImageBytes,
		PublicOnly: opts.Untrusted,
		Logger:     opts.Logger,
	})
	if err != nil {
		if errors.Is(err, image.ErrBadReference) || errors.Is(err, image.ErrNotFound) {
			return cfg, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		return cfg, err
	}
	return res.Config, nil
}

// applyArg declares an ARG: its value is the build argument if given,
// else its default.
func applyArg(st *state, step Step, buildArgs map[string]string) error {
	ws, err := buildspec.Words(step.Raw, st.lookup)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	for _, w := range ws {
		name, def, hasDef := strings.Cut(w, "=")
		if name == "" {
			return fmt.Errorf("%w: ARG without a name", ErrInvalid)
		}
		if v, ok := buildArgs[name]; ok {
			st.args[name], st.argSet[name] = v, true
		} else if hasDef {
			st.args[name], st.argSet[name] = def, true
		} else if _, ok := st.args[name]; !ok {
			st.argSet[name] = false
		}
	}
	return nil
}

// runStep applies one step; for RUN and COPY it returns the exit code of
// what ran.
func runStep(ctx context.Context, r *runner, rootfs string, st *state, step Step, opts Options) (int, error) {
	args := step.Args
	if step.Raw != "" && step.Kind != StepArg {
		var err error
		if args, err = splitRaw(step, st); err != nil {
			return -1, err
		}
	}
	switch step.Kind {
	case StepArg:
		return 0, applyArg(st, step, opts.BuildArgs)
	case StepEnv:
		pairs, err := envPairs(args, step.Raw != "")
		if err != nil {
			return -1, err
		}
		for i := 0; i+1 < len(pairs); i += 2 {
			st.setEnv(pairs[i], pairs[i+1])
		}
		return 0, nil
	case StepWorkdir:
		if len(args) != 1 {
			return -1, fmt.Errorf("%w: WORKDIR takes one directory", ErrInvalid)
		}
		dir := args[0]
		if !path.IsAbs(dir) {
			dir = path.Join("/", st.workdir, dir)
		}
		st.workdir = path.Clean(dir)
		// Like Docker, the directory exists from here on.
		return r.run(ctx, rootfs, runSpec{
			argv: []string{"/bin/sh", "-c", `mkdir -p -- "$1"`, "sh", st.workdir},
			env:  runEnv(st, nil), cwd: "/",
		}, opts.Log)
	case StepUser:
		if len(args) != 1 || args[0] == "" {
			return -1, fmt.Errorf("%w: USER takes one user[:group]", ErrInvalid)
		}
		if _, err := lookupUser(rootfs, args[0]); err != nil {
			return -1, err
		}
		st.user = args[0]
		return 0, nil
	case StepCmd, StepEntry:
		argv := args
		if step.Shell {
			argv = []string{"/bin/sh", "-c", args[0]}
		}
		if step.Kind == StepCmd {
			st.cmd = argv
		} else {
			st.entry = argv
		}
		return 0, nil
	case StepRun:
		if len(args) == 0 {
			return -1, fmt.Errorf("%w: RUN without a command", ErrInvalid)
		}
		user := st.user
		if step.User != "" {
			user = step.User
		}
		u, err := lookupUser(rootfs, user)
		if err != nil {
			return -1, err
		}
		argv := args
		if step.Shell {
			argv = []string{"/bin/sh", "-c", args[0]}
		}
		cwd := st.workdir
		if cwd == "" {
			cwd = "/"
		}
		return r.run(ctx, rootfs, runSpec{argv: argv, env: runEnv(st, u), cwd: cwd, uid: u.uid, gid: u.gid}, opts.Log)
	case StepCopy:
		return copyStep(ctx, r, rootfs, st, step, args, opts)
	}
	return -1, fmt.Errorf("%w: unsupported step %s", ErrInvalid, step.Kind)
}

// envPairs turns ENV's arguments into name, value pairs. A Dockerfile's
// words are `k=v ...` or the legacy `k v w` (the value is the rest);
// steps from elsewhere are pairs already.
func envPairs(args []string, dockerfile bool) ([]string, error) {
	if !dockerfile {
		if len(args)%2 != 0 || len(args) == 0 {
			return nil, fmt.Errorf("%w: ENV needs name, value pairs", ErrInvalid)
		}
		return args, nil
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("%w: ENV needs NAME=VALUE", ErrInvalid)
	}
	if !strings.Contains(args[0], "=") {
		if len(args) < 2 {
			return nil, fmt.Errorf("%w: ENV %s has no value", ErrInvalid, args[0])
		}
		return []string{args[0], strings.Join(args[1:], " ")}, nil
	}
	var out []string
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%w: ENV %q is not NAME=VALUE", ErrInvalid, a)
		}
		out = append(out, k, v)
	}
	return out, nil
}

// runEnv is the environment of a RUN: the build's ARGs, then its ENV
// (which wins), then PATH and HOME if still unset.
func runEnv(st *state, u *account) []string {
	var env []string
	seen := map[string]bool{}
	for _, kv := range st.env {
		k, _, _ := strings.Cut(kv, "=")
		seen[k] = true
	}
	for k, set := range st.argSet {
		if set && !seen[k] {
			env = append(env, k+"="+st.args[k])
			seen[k] = true
		}
	}
	env = append(env, st.env...)
	if !seen["PATH"] {
		env = append(env, "PATH="+defaultPath)
	}
	if !seen["HOME"] {
		home := "/root"
		if u != nil && u.home != "" {
			home = u.home
		}
		env = append(env, "HOME="+home)
	}
	return env
}

// copyStep copies files from the build context into the root filesystem.
// The copy runs inside a sandbox with the sources mounted read-only, so
// that the destination is resolved inside the root filesystem (its
// symlinks cannot lead the copy out of it) and names in --chown are the
// image's.
func copyStep(ctx context.Context, r *runner, rootfs string, st *state, step Step, args []string, opts Options) (int, error) {
	chown := step.Chown
	var rest []string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--chown="); ok && len(rest) == 0 {
			chown = v
			continue
		}
		if strings.HasPrefix(a, "--") && len(rest) == 0 {
			return -1, fmt.Errorf("%w: COPY flag %s is not supported", ErrInvalid, a)
		}
		rest = append(rest, a)
	}
	if len(rest) < 2 {
		return -1, fmt.Errorf("%w: COPY needs a source and a destination", ErrInvalid)
	}
	ctxDir := opts.ContextDir
	if step.Context != "" {
		ctxDir = step.Context
	}
	if ctxDir == "" {
		return -1, fmt.Errorf("%w: COPY needs a build context", ErrInvalid)
	}
	if step.Chmod != "" {
		if _, err := strconv.ParseUint(step.Chmod, 8, 32); err != nil {
			return -1, fmt.Errorf("%w: COPY mode %q is not octal", ErrInvalid, step.Chmod)
		}
	}
	srcs, err := contextSources(ctxDir, rest[:len(rest)-1])
	if err != nil {
		return -1, err
	}
	dest := rest[len(rest)-1]
	dirDest := strings.HasSuffix(dest, "/")
	if !path.IsAbs(dest) {
		dest = path.Join("/", st.workdir, dest)
	}
	dest = path.Clean(dest)
	if len(srcs) > 1 && !dirDest {
		return -1, fmt.Errorf("%w: COPY with several sources needs a destination ending in /", ErrInvalid)
	}
	if chown == "" {
		chown = "0:0"
	}
	owner, err := lookupUser(rootfs, chown)
	if err != nil {
		return -1, err
	}
	if !strings.Contains(chown, ":") {
		// Like Docker: a user without a group gets the group of the same
		// number.
		chown = fmt.Sprintf("%d:%d", owner.uid, owner.uid)
	}
	// $1 owner, $2 mode of files ("" keeps), $3 destination, $4 "dir"
	// when it must be a directory, then kind (f|d) and basename for each
	// source, mounted at /.aenv-build/srcN in order.
	script := `set -e
own=$1 mode=$2; shift
dest=$2 isdir=$3; shift 3
i=0
while [ $# -gt 0 ]; do
  kind=$1 name=$2; shift 2
  src=/.aenv-build/src$i; i=$((i+1))
  if [ "$kind" = d ]; then
    # A directory's contents merge into the destination; only what was
    # copied changes owner.
    mkdir -p -- "$dest"
    cp -a -- "$src/." "$dest/"
    (cd "$src" && find . -mindepth 1 -exec sh -c 'o=$1 d=$2; shift 2; for f; do chown -h -- "$o" "$d/$f"; done' sh "$own" "$dest" {} +)
    if [ -n "$mode" ]; then
      (cd "$src" && find . -type f -exec sh -c 'm=$1 d=$2; shift 2; for f; do chmod -- "$m" "$d/$f"; done' sh "$mode" "$dest" {} +)
    fi
  else
    if [ "$isdir" = dir ] || [ -d "$dest" ]; then
      mkdir -p -- "$dest"; t="$dest/$name"
    else
      mkdir -p -- "${dest%/*}/"; t=$dest
    fi
    cp -a -- "$src" "$t"
    chown -h -- "$own" "$t"
    if [ -n "$mode" ]; then chmod -- "$mode" "$t"; fi
  fi
done`
	argv := []string{"/bin/sh", "-c", script, "sh", chown, step.Chmod, dest, map[bool]string{true: "dir", false: ""}[dirDest]}
	var mounts []string
	for _, s := range srcs {
		kind := "f"
		if s.dir {
			kind = "d"
		}
		argv = append(argv, kind, s.name)
		mounts = append(mounts, s.host)
	}
	code, err := r.run(ctx, rootfs, runSpec{argv: argv, env: runEnv(st, nil), cwd: "/", mounts: mounts}, opts.Log)
	// The next COPY's sources may not be of the same types as this one's
	// mount points.
	if rmErr := r.removeMountPoints(rootfs); rmErr != nil && err == nil {
		err = rmErr
	}
	return code, err
}

// contextSource is a COPY source on the host.
type contextSource struct {
	host, name string
	dir        bool
}

// contextSources resolves COPY sources (globs allowed) inside the context
// directory, refusing any that would lead out of it, by `..` or by a
// symlink.
func contextSources(ctxDir string, srcs []string) ([]contextSource, error) {
	root, err := filepath.EvalSymlinks(ctxDir)
	if err != nil {
		return nil, fmt.Errorf("%w: build context: %w", ErrInvalid, err)
	}
	root, _ = filepath.Abs(root)
	var out []contextSource
	for _, src := range srcs {
		rel := filepath.Clean(strings.TrimLeft(src, "/"))
		if rel == ".." || strings.HasPrefix(rel, "../") {
			return nil, fmt.Errorf("%w: COPY source %q is outside the build context", ErrInvalid, src)
		}
		pattern := filepath.Join(root, rel)
		matches := []string{pattern}
		if strings.ContainsAny(rel, "*?[") {
			matches, err = filepath.Glob(pattern)
			if err != nil {
				return nil, fmt.Errorf("%w: COPY source %q: %w", ErrInvalid, src, err)
			}
			if len(matches) == 0 {
				return nil, fmt.Errorf("%w: COPY source %q matches nothing in the build context", ErrInvalid, src)
			}
		}
		for _, m := range matches {
			real, err := filepath.EvalSymlinks(m)
			if err != nil {
				return nil, fmt.Errorf("%w: COPY source %q: %w", ErrInvalid, src, err)
			}
			if real != root && !strings.HasPrefix(real, root+string(filepath.Separator)) {
				return nil, fmt.Errorf("%w: COPY source %q leads outside the build context", ErrInvalid, src)
			}
			fi, err := os.Stat(real)
			if err != nil {
				return nil, fmt.Errorf("%w: COPY source %q: %w", ErrInvalid, src, err)
			}
			if !fi.IsDir() && !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("%w: COPY source %q is not a file or directory", ErrInvalid, src)
			}
			out = append(out, contextSource{host: real, name: filepath.Base(m), dir: fi.IsDir()})
		}
	}
	return out, nil
}

// splitRaw splits and expands a Dockerfile step's text. COPY keeps its
// leading flags as words and may use the JSON form after them.
func splitRaw(step Step, st *state) ([]string, error) {
	raw := strings.TrimSpace(step.Raw)
	var flags []string
	if step.Kind == StepCopy {
		for strings.HasPrefix(raw, "--") {
			flag, rest, _ := strings.Cut(raw, " ")
			flags = append(flags, flag)
			raw = strings.TrimSpace(rest)
		}
		if argv, ok := buildspec.JSONArray(raw); ok {
			out, err := buildspec.Words(strings.Join(flags, " "), st.lookup)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
			}
			for _, a := range argv {
				w, err := buildspec.Words(a, st.lookup)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
				}
				out = append(out, strings.Join(w, " "))
			}
			return out, nil
		}
	}
	out, err := buildspec.Words(strings.TrimSpace(strings.Join(flags, " ")+" "+raw), st.lookup)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return out, nil
}
