// Package interpreter is the code-interpreter service of the
// code-interpreter template: the HTTP API on port 49999 that
// @e2b/code-interpreter calls (POST /execute streaming newline-delimited
// JSON, and /contexts), over IPython.
//
// Each context is one Python process running IPython's shell, driven
// over pipes (kernel.go) rather than through a Jupyter kernel or
// jupyter-server: one static Go binary and one Python process per context
// is all a sandbox runs, nothing else to start, keep alive or snapshot,
// and interrupts, restarts and output routing stay in this process, where
// a timeout or a dropped request can act on them at once.
package interpreter

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// DefaultPython is Debian's interpreter, whose IPython the template's
// packages install (a python3 earlier in PATH may lack it).
const DefaultPython = "/usr/bin/python3"

// event is one line of an /execute response.
type event map[string]any

// Config configures a Server.
type Config struct {
	// Python is the interpreter kernels run with; DefaultPython if empty.
	Python string
	// Cwd is the default working directory of new contexts.
	Cwd string
	// Cred, when set, runs kernels as another user.
	Cred   *syscall.Credential
	Env    []string
	Logger *slog.Logger
	// EnvdURL, when set, is the sandbox's envd: the environment the
	// sandbox was created with (GET /envs) applies to every execution, as
	// kernels started before the create (in the template's snapshot)
	// never saw it, and requests must carry the access token envd demands
	// (see withAuth). Empty, nothing checks tokens.
	EnvdURL string
}

// Server holds the contexts and serves the API.
type Server struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	contexts map[string]*codeContext
	// defaults are the contexts /execute uses when given only a language.
	defaults map[string]*codeContext
	// env is the sandbox's environment once read from envd (never
	// modified after).
	env map[string]string
}

// codeContext is one kernel and what it was made with.
type codeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`

	// mu serialises executions, as a notebook runs one cell at a time.
	mu sync.Mutex
	// globals is the sandbox environment last put into the kernel (JSON).
	globals string
	python  *pythonKernel
	bash    *bashKernel
}

// languages maps what clients send to the kernels there are.
var languages = map[string]string{"": "python", "python": "python", "python3": "python", "bash": "bash", "sh": "bash"}

// ErrUnsupportedLanguage is returned for a language without a kernel.
var ErrUnsupportedLanguage = errors.New("unsupported language")

// New makes a server; Start brings up its default Python context.
func New(cfg Config) *Server {
	if cfg.Python == "" {
		cfg.Python = DefaultPython
	}
	if cfg.Cwd == "" {
		cfg.Cwd, _ = os.Getwd()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	return &Server{cfg: cfg, log: cfg.Logger, contexts: map[string]*codeContext{}, defaults: map[string]*codeContext{}}
}

// Start starts the default Python kernel, so that the first execution
// does not wait for one (a template snapshots the sandbox after this).
func (s *Server) Start(ctx context.Context) error {
	_, err := s.defaultContext(ctx, "python")
	return err
}

// Close ends every kernel.
func (s *Server) Close() {
	s.mu.Lock()
	all := s.contexts
	s.contexts, s.defaults = map[string]*codeContext{}, map[string]*codeContext{}
	s.mu.Unlock()
	for _, c := range all {
		c.stop()
	}
}

// startupCode prepares every Python kernel: plain tracebacks (agents read
// them, terminal colours only get in the way), figures shown inline as
// PNG, and a formatter that describes matplotlib figures as E2B charts.
// It imports the data stack ahead of use, so that a template snapshotted
// after start-up has it in memory.
const startupCode = `
def __aenv_setup():
    ip = get_ipython()
    ip.run_line_magic('colors', 'NoColor')
    try:
        import numpy, pandas
    except Exception:
        pass
    try:
        import matplotlib
        matplotlib.use('module://matplotlib_inline.backend_inline')
        import matplotlib.pyplot
    except Exception:
        return
    from IPython.core.formatters import BaseFormatter
    from traitlets import Unicode, ObjectName

    class ChartFormatter(BaseFormatter):
        format_type = Unicode('application/vnd.aenv.chart+json')
        print_method = ObjectName('_repr_aenv_chart_')
        _return_type = (dict,)

    def num(v):
        try:
            return float(v)
        except Exception:
            return str(v)

    def chart(fig):
        axes = fig.get_axes()
        if len(axes) != 1:
            return None
        ax = axes[0]
        c = {'title': ax.get_title() or None, 'x_label': ax.get_xlabel() or None,
             'y_label': ax.get_ylabel() or None, 'elements': []}
        lines = [l for l in ax.get_lines() if not str(l.get_label()).startswith('_child')]
        bars = [p for cont in ax.containers for p in cont]
        points = [col for col in ax.collections if hasattr(col, 'get_offsets')]
        if bars:
            c['type'] = 'bar'
            labels = [t.get_text() for t in ax.get_xticklabels()]
            for i, p in enumerate(bars):
                c['elements'].append({'label': labels[i] if i < len(labels) else str(i),
                                      'group': '', 'value': num(p.get_height())})
        elif lines:
            c['type'] = 'line'
            c['x_scale'], c['y_scale'] = ax.get_xscale(), ax.get_yscale()
            for l in lines:
                xs, ys = l.get_xdata(), l.get_ydata()
                c['elements'].append({'label': str(l.get_label()),
                                      'points': [[num(x), num(y)] for x, y in zip(xs, ys)]})
        elif points:
            c['type'] = 'scatter'
            for col in points:
                c['elements'].append({'label': str(col.get_label()),
                                      'points': [[num(x), num(y)] for x, y in col.get_offsets()]})
        else:
            c['type'] = 'unknown'
        return c

    f = ChartFormatter(parent=ip.display_formatter)
    ip.display_formatter.formatters[f.format_type] = f
    if f.format_type not in ip.display_formatter.active_types:
        ip.display_formatter.active_types.append(f.format_type)
    # A method rather than a type printer: the inline backend drops every
    # formatter's Figure printer when it loads.
    matplotlib.figure.Figure._repr_aenv_chart_ = chart
    # Load the backend now, not on the user's first plot.
    matplotlib.pyplot.close(matplotlib.pyplot.figure())

__aenv_setup()
del __aenv_setup
`

// mimeKeys maps a display bundle's MIME types to the SDK's result fields.
var mimeKeys = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript",
	"application/vnd.aenv.chart+json": "chart",
}

func (s *Server) startKernel(ctx context.Context, c *codeContext) error {
	opts := kernelOptions{Python: s.cfg.Python, Cwd: c.Cwd, Env: s.cfg.Env, Cred: s.cfg.Cred, Startup: startupCode}
	log := s.log.With("context_id", c.ID, "language", c.Language)
	start := time.Now()
	var err error
	switch c.Language {
	case "python":
		c.python, err = startPythonKernel(ctx, log, opts)
	case "bash":
		c.bash, err = startBashKernel(log, opts)
	}
	if err != nil {
		return fmt.Errorf("context %s: %w", c.ID, err)
	}
	log.Info("kernel started", "cwd", c.Cwd, "took_ms", time.Since(start).Milliseconds())
	return nil
}

func (c *codeContext) stop() {
	if c.python != nil {
		c.python.close()
		c.python = nil
	}
	if c.bash != nil {
		c.bash.close()
		c.bash = nil
	}
}

// create starts a new context.
func (s *Server) create(ctx context.Context, language, cwd string) (*codeContext, error) {
	lang, ok := languages[strings.ToLower(language)]
	if !ok {
		return nil, fmt.Errorf("%w %q: this sandbox runs python and bash", ErrUnsupportedLanguage, language)
	}
	if cwd == "" {
		cwd = s.cfg.Cwd
	}
	if st, err := os.Stat(cwd); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("working directory %q: %w", cwd, errBadCwd)
	}
	c := &codeContext{ID: newToken(), Language: lang, Cwd: cwd}
	if err := s.startKernel(ctx, c); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.contexts[c.ID] = c
	s.mu.Unlock()
	return c, nil
}

var errBadCwd = errors.New("not a directory")

// defaultContext returns (starting it once) the context for a language.
func (s *Server) defaultContext(ctx context.Context, language string) (*codeContext, error) {
	lang, ok := languages[strings.ToLower(language)]
	if !ok {
		return nil, fmt.Errorf("%w %q: this sandbox runs python and bash", ErrUnsupportedLanguage, language)
	}
	s.mu.Lock()
	c := s.defaults[lang]
	s.mu.Unlock()
	if c != nil {
		return c, nil
	}
	c, err := s.create(ctx, lang, "")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if old := s.defaults[lang]; old != nil {
		// Two first executions raced; keep the one that won.
		delete(s.contexts, c.ID)
		s.mu.Unlock()
		c.stop()
		return old, nil
	}
	s.defaults[lang] = c
	s.mu.Unlock()
	return c, nil
}

func (s *Server) get(id string) *codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.contexts[id]
}

// execute runs code in c and streams events. It returns an error only
// for what the client should see as a failed execution (the kernel died,
// the request ended); the code's own exceptions are events.
func (s *Server) execute(ctx context.Context, c *codeContext, code string, globals, env map[string]string, emit func(event)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.python == nil && c.bash == nil {
		// An earlier execution killed it; start afresh.
		if err := s.startKernel(context.WithoutCancel(ctx), c); err != nil {
			return err
		}
		c.globals = ""
	}
	// The sandbox's own environment goes into the kernel once (and again
	// only if it changes), not around every execution.
	if b, _ := json.Marshal(globals); len(globals) > 0 && string(b) != c.globals {
		var err error
		if c.bash != nil {
			err = c.bash.setEnv(ctx, globals)
		} else {
			err = c.python.execute(ctx, fmt.Sprintf("__import__('os').environ.update(__import__('json').loads(__import__('base64').b64decode(%q)))\n",
				base64.StdEncoding.EncodeToString(b)), true, func(string, json.RawMessage) {})
		}
		if err != nil {
			return err
		}
		c.globals = string(b)
	}
	var err error
	if c.bash != nil {
		err = c.bash.execute(ctx, code, env, emit)
	} else {
		err = runPython(ctx, c.python, code, env, emit)
	}
	if err != nil && c.bash != nil || errors.Is(err, errKernelDied) {
		// A shell cut off mid-command, or a kernel that died, is replaced
		// before the next execution.
		s.log.Warn("restarting context", "context_id", c.ID, "err", err)
		c.stop()
	}
	return err
}

var errKernelDied = errors.New("the kernel died")

// runPython runs code in a Python kernel with env set for its duration.
func runPython(ctx context.Context, k *pythonKernel, code string, env map[string]string, emit func(event)) error {
	quiet := func(string, json.RawMessage) {}
	if len(env) > 0 {
		b, _ := json.Marshal(env)
		set := fmt.Sprintf("__aenv_env = __import__('json').loads(__import__('base64').b64decode(%q))\n"+
			"__aenv_saved = {k: __import__('os').environ.get(k) for k in __aenv_env}\n"+
			"__import__('os').environ.update(__aenv_env)\n", base64.StdEncoding.EncodeToString(b))
		if err := k.execute(ctx, set, true, quiet); err != nil {
			return err
		}
		defer func() {
			// Bounded: behind code that ignored an interrupt it would
			// otherwise wait for good.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			k.execute(rctx, "[__import__('os').environ.pop(k, None) if v is None else __import__('os').environ.__setitem__(k, v) for k, v in __aenv_saved.items()]\n"+
				"del __aenv_env, __aenv_saved\n", true, quiet)
		}()
	}
	err := k.execute(ctx, code, false, func(typ string, content json.RawMessage) {
		switch typ {
		case "stream":
			var m struct{ Name, Text string }
			json.Unmarshal(content, &m)
			if m.Name == "stdout" || m.Name == "stderr" {
				emit(event{"type": m.Name, "text": m.Text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
			}
		case "execute_result", "display_data":
			var m struct {
				Data map[string]json.RawMessage `json:"data"`
			}
			json.Unmarshal(content, &m)
			ev := event{"type": "result", "is_main_result": typ == "execute_result"}
			for mime, v := range m.Data {
				key, ok := mimeKeys[mime]
				if !ok {
					key = mime
				}
				var val any
				json.Unmarshal(v, &val)
				if val == nil {
					continue
				}
				ev[key] = val
			}
			emit(ev)
		case "error":
			var m struct {
				Ename     string   `json:"ename"`
				Evalue    string   `json:"evalue"`
				Traceback []string `json:"traceback"`
			}
			json.Unmarshal(content, &m)
			emit(event{"type": "error", "name": m.Ename, "value": m.Evalue, "traceback": strings.Join(m.Traceback, "\n")})
		case "execute_reply":
			var m struct {
				ExecutionCount int `json:"execution_count"`
			}
			json.Unmarshal(content, &m)
			emit(event{"type": "number_of_executions", "execution_count": m.ExecutionCount})
		}
	})
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %v", errKernelDied, err)
	}
	return err
}

// restart replaces a context's kernel with a fresh one (its state is
// gone; id, language and directory stay).
func (s *Server) restart(ctx context.Context, c *codeContext) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stop()
	return s.startKernel(ctx, c)
}

func (s *Server) remove(id string) bool {
	s.mu.Lock()
	c := s.contexts[id]
	delete(s.contexts, id)
	for lang, d := range s.defaults {
		if d == c {
			delete(s.defaults, lang)
		}
	}
	s.mu.Unlock()
	if c == nil {
		return false
	}
	c.mu.Lock()
	c.stop()
	c.mu.Unlock()
	return true
}

func (s *Server) list() []*codeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}
